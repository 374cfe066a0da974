//! Verifier tests. Modules are built by hand (a small builder below) so every rule
//! can be exercised independently of the text parser; `text_cases` repeats a few
//! through `hlo::parse_text` once the parser exists.

use cranelift_entity::{EntityRef, PrimaryMap};
use hlo::{
    Array, Attrs, CompId, ComparisonDirection, Computation, DotDims, ErrorKind, InstrId, Instruction,
    IotaReplicaGroups, Literal, Module, ModuleConfig, Opcode, PadDim, PrimitiveType as T, ReplicaGroups, Shape,
    SliceDim, Span,
};

fn a(ty: T, dims: &[i64]) -> Shape {
    Shape::array(ty, dims.to_vec())
}
fn f32s(dims: &[i64]) -> Shape {
    a(T::F32, dims)
}
fn tup(v: &[Shape]) -> Shape {
    Shape::Tuple(v.to_vec())
}

/// Builds a module computation by computation; every instruction gets its own line.
struct B {
    instrs: PrimaryMap<InstrId, Instruction>,
    comps: PrimaryMap<CompId, Computation>,
    cur: Vec<InstrId>,
    params: Vec<InstrId>,
    line: u32,
}

impl B {
    fn new() -> Self {
        B { instrs: PrimaryMap::new(), comps: PrimaryMap::new(), cur: vec![], params: vec![], line: 1 }
    }

    fn op(&mut self, name: &str, opcode: Opcode, shape: Shape, operands: &[InstrId]) -> InstrId {
        self.with(name, opcode, shape, operands, |_| {})
    }

    fn with(
        &mut self,
        name: &str,
        opcode: Opcode,
        shape: Shape,
        operands: &[InstrId],
        f: impl FnOnce(&mut Instruction),
    ) -> InstrId {
        self.line += 1;
        let mut ins = Instruction {
            name: name.into(),
            opcode,
            shape,
            operands: operands.to_vec(),
            called: vec![],
            attrs: Attrs::default(),
            parent: CompId::new(self.comps.len()),
            span: Some(Span { line: self.line, col: 3, len: name.len() as u32 }),
        };
        f(&mut ins);
        let id = self.instrs.push(ins);
        self.cur.push(id);
        id
    }

    fn param(&mut self, name: &str, n: i64, shape: Shape) -> InstrId {
        let id = self.with(name, Opcode::Parameter, shape, &[], |i| i.attrs.parameter_number = Some(n));
        self.params.push(id);
        id
    }

    fn constant(&mut self, name: &str, lit: Array) -> InstrId {
        let shape = Shape::Array(lit.shape.clone());
        self.with(name, Opcode::Constant, shape, &[], |i| i.attrs.literal = Some(Literal::Array(lit)))
    }

    fn finish(&mut self, name: &str, root: InstrId) -> CompId {
        self.line += 2;
        let comp = Computation {
            name: name.into(),
            instrs: std::mem::take(&mut self.cur),
            params: std::mem::take(&mut self.params),
            root,
            span: None,
        };
        self.comps.push(comp)
    }

    /// `add { a = T[] parameter(0); b = T[] parameter(1); ROOT s = T[] add(a, b) }`.
    fn adder(&mut self, name: &str, ty: T) -> CompId {
        let x = self.param("x", 0, a(ty, &[]));
        let y = self.param("y", 1, a(ty, &[]));
        let s = self.op("sum", Opcode::Add, a(ty, &[]), &[x, y]);
        self.finish(name, s)
    }

    fn module(self, entry: CompId) -> Module {
        Module {
            name: "m".into(),
            config: ModuleConfig { replica_count: 1, num_partitions: 1, ..Default::default() },
            comps: self.comps,
            instrs: self.instrs,
            entry,
            source_name: "t.hlo".into(),
        }
    }
}

/// Wraps the instructions built by `f` in an entry computation whose root is `f`'s result.
fn entry(f: impl FnOnce(&mut B) -> InstrId) -> Module {
    let mut b = B::new();
    let root = f(&mut b);
    let e = b.finish("main", root);
    b.module(e)
}

fn entry_with_adder(f: impl FnOnce(&mut B, CompId) -> InstrId) -> Module {
    let mut b = B::new();
    let add = b.adder("add", T::F32);
    let root = f(&mut b, add);
    let e = b.finish("main", root);
    b.module(e)
}

/// Asserts that verification fails at instruction `name` with `fragment` in the message.
#[track_caller]
fn rejects(m: &Module, name: &str, fragment: &str) {
    let e = hlo::verify::verify(m).expect_err("module should be rejected");
    assert_eq!(e.kind, ErrorKind::Verify);
    assert_eq!(e.file, "t.hlo");
    let ins = m.instrs.values().find(|i| i.name == name).expect("instruction");
    let span = ins.span.unwrap();
    assert_eq!((e.line, e.col, e.caret_len), (span.line, span.col, span.len), "location of: {}", e.message);
    assert!(e.message.starts_with(&format!("%{name}: ")), "{}", e.message);
    assert!(e.message.contains(fragment), "expected {fragment:?} in {:?}", e.message);
}

#[track_caller]
fn accepts(m: &Module) {
    if let Err(e) = hlo::verify::verify(m) {
        panic!("unexpected rejection: {e}");
    }
}

fn groups(g: &[&[i64]]) -> Option<ReplicaGroups> {
    Some(ReplicaGroups::Explicit(g.iter().map(|x| x.to_vec()).collect()))
}

// ------------------------------------------------------------------ elementwise

#[test]
fn binary_type_mismatch() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        let y = b.param("y", 1, a(T::S32, &[4]));
        b.op("add.3", Opcode::Add, f32s(&[4]), &[x, y])
    });
    rejects(&m, "add.3", "add operands must have the same element type and dimensions, got f32[4] and s32[4]");
}

#[test]
fn binary_dims_mismatch_and_result() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        let y = b.param("y", 1, f32s(&[5]));
        b.op("mul", Opcode::Multiply, f32s(&[4]), &[x, y])
    });
    rejects(&m, "mul", "got f32[4] and f32[5]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("sub", Opcode::Subtract, f32s(&[2, 2]), &[x, x])
    });
    rejects(&m, "sub", "subtract result must be f32[4]");
}

#[test]
fn compare_needs_direction_and_pred() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("cmp", Opcode::Compare, a(T::Pred, &[4]), &[x, x])
    });
    rejects(&m, "cmp", "compare needs a direction");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.with("cmp", Opcode::Compare, f32s(&[4]), &[x, x], |i| {
            i.attrs.comparison_direction = Some(ComparisonDirection::Lt)
        })
    });
    rejects(&m, "cmp", "compare result must be pred[4]");
}

#[test]
fn logical_and_shift_need_ints() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("and", Opcode::And, f32s(&[4]), &[x, x])
    });
    rejects(&m, "and", "and needs pred or integer operands, got f32[4]");
    let m = entry(|b| {
        let x = b.param("x", 0, a(T::Pred, &[4]));
        b.op("shl", Opcode::ShiftLeft, a(T::Pred, &[4]), &[x, x])
    });
    rejects(&m, "shl", "shift-left needs integer operands");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("not", Opcode::Not, f32s(&[4]), &[x])
    });
    rejects(&m, "not", "not needs a pred or integer operand");
}

#[test]
fn unary_keeps_shape() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("e", Opcode::Exp, a(T::F16, &[4]), &[x])
    });
    rejects(&m, "e", "exponential result must be f32[4]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("n", Opcode::Negate, f32s(&[4]), &[x, x])
    });
    rejects(&m, "n", "negate expects 1 operand, got 2");
}

#[test]
fn select_and_clamp() {
    let m = entry(|b| {
        let p = b.param("p", 0, a(T::S32, &[4]));
        let x = b.param("x", 1, f32s(&[4]));
        b.op("sel", Opcode::Select, f32s(&[4]), &[p, x, x])
    });
    rejects(&m, "sel", "select predicate must be pred, got s32[4]");
    let m = entry(|b| {
        let p = b.param("p", 0, a(T::Pred, &[2]));
        let x = b.param("x", 1, f32s(&[4]));
        b.op("sel", Opcode::Select, f32s(&[4]), &[p, x, x])
    });
    rejects(&m, "sel", "must be a scalar or have the branches' dimensions");
    let m = entry(|b| {
        let lo = b.param("lo", 0, f32s(&[3]));
        let x = b.param("x", 1, f32s(&[4]));
        b.op("cl", Opcode::Clamp, f32s(&[4]), &[lo, x, lo])
    });
    rejects(&m, "cl", "clamp min must be a scalar or match the operand");
}

// ------------------------------------------------------------------ data movement

#[test]
fn convert_and_bitcast_convert() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("cv", Opcode::Convert, a(T::S32, &[2, 2]), &[x])
    });
    rejects(&m, "cv", "convert must keep the dimensions, got f32[4] -> s32[2,2]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.op("bc", Opcode::BitcastConvert, a(T::S8, &[4]), &[x])
    });
    rejects(&m, "bc", "must give dimensions {4,4}, got s8[4]");
    let m = entry(|b| {
        let x = b.param("x", 0, a(T::S8, &[4, 2]));
        b.op("bc", Opcode::BitcastConvert, f32s(&[4]), &[x])
    });
    rejects(&m, "bc", "minor dimension must be 4");
}

#[test]
fn broadcast_dims() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[3]));
        b.with("br", Opcode::Broadcast, f32s(&[2, 4]), &[x], |i| i.attrs.dimensions = Some(vec![1]))
    });
    rejects(&m, "br", "operand dimension 0 (size 3) to result dimension 1 (size 4)");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[3]));
        b.with("br", Opcode::Broadcast, f32s(&[3, 3]), &[x], |i| i.attrs.dimensions = Some(vec![0, 1]))
    });
    rejects(&m, "br", "must map each of the 1 operand dimensions");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[3]));
        b.with("br", Opcode::Broadcast, f32s(&[3, 3]), &[x], |i| i.attrs.dimensions = Some(vec![2]))
    });
    rejects(&m, "br", "must be distinct dimensions of the result");
}

#[test]
fn reshape_bitcast_transpose() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        b.op("r", Opcode::Reshape, f32s(&[5]), &[x])
    });
    rejects(&m, "r", "reshape must keep the element type and element count, got f32[2,3] -> f32[5]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.op("bt", Opcode::Bitcast, a(T::S16, &[2]), &[x])
    });
    rejects(&m, "bt", "bitcast must keep the byte size");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        b.with("tr", Opcode::Transpose, f32s(&[3, 2]), &[x], |i| i.attrs.dimensions = Some(vec![0, 0]))
    });
    rejects(&m, "tr", "transpose dimensions={0,0} must be a permutation of 0..2");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        b.with("tr", Opcode::Transpose, f32s(&[2, 3]), &[x], |i| i.attrs.dimensions = Some(vec![1, 0]))
    });
    rejects(&m, "tr", "transpose result must be f32[3,2]");
}

fn sl(start: i64, limit: i64, stride: i64) -> SliceDim {
    SliceDim { start, limit, stride }
}

#[test]
fn slices() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("s", Opcode::Slice, f32s(&[4]), &[x], |i| i.attrs.slice = Some(vec![sl(6, 10, 1)]))
    });
    rejects(&m, "s", "slice [6:10] in dimension 0 is out of bounds");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("s", Opcode::Slice, f32s(&[4]), &[x], |i| i.attrs.slice = Some(vec![sl(0, 8, 0)]))
    });
    rejects(&m, "s", "stride in dimension 0 must be positive");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("s", Opcode::Slice, f32s(&[4]), &[x], |i| i.attrs.slice = Some(vec![sl(1, 8, 3)]))
    });
    rejects(&m, "s", "slice result must be f32[3]");
}

#[test]
fn dynamic_slices() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8, 4]));
        let i = b.param("i", 1, a(T::S32, &[]));
        let f = b.param("f", 2, f32s(&[]));
        b.with("ds", Opcode::DynamicSlice, f32s(&[2, 2]), &[x, i, f], |i| {
            i.attrs.dynamic_slice_sizes = Some(vec![2, 2])
        })
    });
    rejects(&m, "ds", "start index (operand 2) must be an integer scalar, got f32[]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8, 4]));
        let i = b.param("i", 1, a(T::S32, &[]));
        b.with("ds", Opcode::DynamicSlice, f32s(&[2, 5]), &[x, i, i], |i| {
            i.attrs.dynamic_slice_sizes = Some(vec![2, 5])
        })
    });
    rejects(&m, "ds", "dynamic_slice_sizes={2,5} must give one size per dimension, each within f32[8,4]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        let u = b.param("u", 1, f32s(&[9]));
        let i = b.param("i", 2, a(T::U32, &[]));
        b.op("dus", Opcode::DynamicUpdateSlice, f32s(&[8]), &[x, u, i])
    });
    rejects(&m, "dus", "update f32[9] must have the operand's element type and rank and fit within f32[8]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8, 8]));
        let i = b.param("i", 1, a(T::S32, &[]));
        b.with("ds", Opcode::DynamicSlice, f32s(&[2, 2]), &[x, i], |i| i.attrs.dynamic_slice_sizes = Some(vec![2, 2]))
    });
    rejects(&m, "ds", "needs one start index per operand dimension (2), got 1");
}

#[test]
fn concatenate_pad_iota_reverse() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        let y = b.param("y", 1, f32s(&[2, 4]));
        b.with("cat", Opcode::Concatenate, f32s(&[4, 3]), &[x, y], |i| i.attrs.dimensions = Some(vec![0]))
    });
    rejects(&m, "cat", "equal dimensions except dimension 0, got f32[2,3] and f32[2,4]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        let v = b.param("v", 1, a(T::S32, &[]));
        b.with("pad", Opcode::Pad, f32s(&[6]), &[x, v], |i| {
            i.attrs.padding = Some(vec![PadDim { lo: 1, hi: 1, interior: 0 }])
        })
    });
    rejects(&m, "pad", "pad value must be a scalar of the operand's element type f32, got s32[]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        let v = b.param("v", 1, f32s(&[]));
        b.with("pad", Opcode::Pad, f32s(&[0]), &[x, v], |i| {
            i.attrs.padding = Some(vec![PadDim { lo: -3, hi: -3, interior: 0 }])
        })
    });
    rejects(&m, "pad", "negative or overflowing size -2");
    let m = entry(|b| b.with("io", Opcode::Iota, a(T::S32, &[4]), &[], |i| i.attrs.iota_dimension = Some(1)));
    rejects(&m, "io", "iota_dimension=1 is out of range");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        b.with("rev", Opcode::Reverse, f32s(&[4]), &[x], |i| i.attrs.dimensions = Some(vec![1]))
    });
    rejects(&m, "rev", "reverse dimensions={1} must be distinct dimensions of f32[4]");
}

#[test]
fn pad_rule_accepts_interior() {
    // 1 + 1 + 4 + (4-1)*1 = 9.
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        let v = b.param("v", 1, f32s(&[]));
        b.with("pad", Opcode::Pad, f32s(&[9]), &[x, v], |i| {
            i.attrs.padding = Some(vec![PadDim { lo: 1, hi: 1, interior: 1 }])
        })
    });
    accepts(&m);
}

// ------------------------------------------------------------------ reduce, dot, tuples, calls

#[test]
fn reduce_rules() {
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[4, 6]));
        let z = b.param("z", 1, f32s(&[]));
        b.with("r", Opcode::Reduce, f32s(&[6]), &[x, z], |i| {
            i.attrs.dimensions = Some(vec![1]);
            i.called = vec![add];
        })
    });
    rejects(&m, "r", "reduce result must be f32[4]");
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[4, 6]));
        let z = b.param("z", 1, f32s(&[1]));
        b.with("r", Opcode::Reduce, f32s(&[4]), &[x, z], |i| {
            i.attrs.dimensions = Some(vec![1]);
            i.called = vec![add];
        })
    });
    rejects(&m, "r", "reduce init value 0 must be a scalar f32");
    // to_apply with the wrong arity for a variadic reduce.
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[4, 6]));
        let y = b.param("y", 1, a(T::S32, &[4, 6]));
        let z = b.param("z", 2, f32s(&[]));
        let zi = b.param("zi", 3, a(T::S32, &[]));
        b.with("r", Opcode::Reduce, tup(&[f32s(&[4]), a(T::S32, &[4])]), &[x, y, z, zi], |i| {
            i.attrs.dimensions = Some(vec![1]);
            i.called = vec![add];
        })
    });
    rejects(&m, "r", "reduce to_apply computation %add must take 4 scalar parameters, got 2");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4, 6]));
        b.with("r", Opcode::Reduce, f32s(&[4]), &[x], |i| i.attrs.dimensions = Some(vec![1]))
    });
    rejects(&m, "r", "reduce needs N inputs and N init values");
}

#[test]
fn reduce_window_rules() {
    let rw = |input: &[i64], window: &str, out: Shape| {
        let window = window.to_string();
        entry_with_adder(|b, add| {
            let x = b.param("x", 0, f32s(input));
            let z = b.param("z", 1, f32s(&[]));
            b.with("rw", Opcode::ReduceWindow, out, &[x, z], |i| {
                i.attrs.other.insert("window".into(), window);
                i.called = vec![add];
            })
        })
    };
    // jnp.cumsum's form, a strided padded pool, dilations, and a scalar.
    accepts(&rw(&[8], "{size=8 pad=7_0}", f32s(&[8])));
    accepts(&rw(&[7, 6], "{size=3x3 stride=2x2 pad=1_1x1_1}", f32s(&[4, 3])));
    accepts(&rw(&[5, 7], "{size=2x3 stride=1x2 pad=1_0x0_1 lhs_dilate=2x1 rhs_dilate=1x2}", f32s(&[9, 2])));
    accepts(&rw(&[], "{}", f32s(&[])));
    accepts(&rw(&[4], "{size=5}", f32s(&[0])));
    // floor((7 + 2 - 3) / 2) + 1 = 4, not 3.
    rejects(
        &rw(&[7, 6], "{size=3x3 stride=2x2 pad=1_1x1_1}", f32s(&[3, 3])),
        "rw",
        "reduce-window result must be f32[4,3] ((padded dilated input - dilated window) / stride + 1 per dimension), got f32[3,3]",
    );
    rejects(&rw(&[8], "{size=8 pad=7_0}", a(T::S32, &[8])), "rw", "reduce-window result must be f32[8]");
    rejects(&rw(&[8], "{size=2x2}", f32s(&[7])), "rw", "window has 2 dimensions for an input of rank 1 (f32[8])");
    rejects(&rw(&[8], "{size=2 stride=0}", f32s(&[7])), "rw", "window dimension 0 has stride=0");
    rejects(&rw(&[8], "{size=2 pad=-5_-5}", f32s(&[7])), "rw", "leaves a negative size -2");
    rejects(&rw(&[8], "{size=2 stride=1x1}", f32s(&[7])), "rw", "stride= has 2 entries for a window of 1 dimensions");
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("rw", Opcode::ReduceWindow, f32s(&[7]), &[x], |i| {
            i.attrs.other.insert("window".into(), "{size=2}".into());
            i.called = vec![add];
        })
    });
    rejects(&m, "rw", "reduce-window needs N inputs and N init values (an even count), got 1 operands");
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("rw", Opcode::ReduceWindow, f32s(&[7]), &[x, x], |i| {
            i.attrs.other.insert("window".into(), "{size=2}".into());
            i.called = vec![add];
        })
    });
    rejects(&m, "rw", "reduce-window init value 0 must be a scalar f32");
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[8]));
        let z = b.param("z", 1, f32s(&[]));
        b.with("rw", Opcode::ReduceWindow, f32s(&[7]), &[x, z], |i| i.called = vec![add])
    });
    rejects(&m, "rw", "reduce-window needs a window={...} attribute");
    // Variadic: a tuple of one result per input, and a reducer of 2N parameters.
    let variadic = |out: Shape| {
        let mut b = B::new();
        let add = b.adder("add", T::F32);
        let x = b.param("x", 0, f32s(&[6]));
        let y = b.param("y", 1, a(T::S32, &[6]));
        let z = b.param("z", 2, f32s(&[]));
        let zi = b.param("zi", 3, a(T::S32, &[]));
        let root = b.with("rw", Opcode::ReduceWindow, out, &[x, y, z, zi], |i| {
            i.attrs.other.insert("window".into(), "{size=2 stride=2}".into());
            i.called = vec![add];
        });
        let e = b.finish("main", root);
        b.module(e)
    };
    rejects(
        &variadic(tup(&[f32s(&[3]), a(T::S32, &[3])])),
        "rw",
        "reduce-window to_apply computation %add must take 4 scalar parameters, got 2",
    );
}

fn dd(lb: &[i64], rb: &[i64], lc: &[i64], rc: &[i64]) -> Option<DotDims> {
    Some(DotDims {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contracting: lc.to_vec(),
        rhs_contracting: rc.to_vec(),
    })
}

#[test]
fn dot_rules() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        let y = b.param("y", 1, f32s(&[4, 5]));
        b.with("d", Opcode::Dot, f32s(&[2, 5]), &[x, y], |i| i.attrs.dot = dd(&[], &[], &[1], &[0]))
    });
    rejects(&m, "d", "contracting dimension lhs 1 (size 3) and rhs 0 (size 4) differ");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[7, 2, 3]));
        let y = b.param("y", 1, f32s(&[7, 3, 5]));
        b.with("d", Opcode::Dot, f32s(&[2, 7, 5]), &[x, y], |i| i.attrs.dot = dd(&[0], &[0], &[2], &[1]))
    });
    rejects(&m, "d", "dot result must have dimensions {7,2,5} (batch, lhs free, rhs free), got f32[2,7,5]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        let y = b.param("y", 1, f32s(&[3, 5]));
        b.with("d", Opcode::Dot, f32s(&[2, 5]), &[x, y], |i| i.attrs.dot = dd(&[0], &[], &[1], &[0]))
    });
    rejects(&m, "d", "must have the same length");
}

#[test]
fn tuple_gte_copy() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.op("t", Opcode::Tuple, tup(&[f32s(&[2]), f32s(&[3])]), &[x, x])
    });
    rejects(&m, "t", "tuple result must be (f32[2], f32[2])");
    let m = entry(|b| {
        let x = b.param("x", 0, tup(&[f32s(&[2]), a(T::S32, &[])]));
        b.with("g", Opcode::GetTupleElement, f32s(&[2]), &[x], |i| i.attrs.tuple_index = Some(2))
    });
    rejects(&m, "g", "get-tuple-element index=2 is out of range for a tuple of 2 elements");
    let m = entry(|b| {
        let x = b.param("x", 0, tup(&[f32s(&[2]), a(T::S32, &[])]));
        b.with("g", Opcode::GetTupleElement, f32s(&[2]), &[x], |i| i.attrs.tuple_index = Some(1))
    });
    rejects(&m, "g", "get-tuple-element result must be s32[] (element 1 of the operand)");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.op("cp", Opcode::Copy, f32s(&[3]), &[x])
    });
    rejects(&m, "cp", "copy result must be f32[2]");
}

#[test]
fn call_rules() {
    let mut b = B::new();
    let add = b.adder("add", T::F32);
    let x = b.param("x", 0, f32s(&[]));
    let c = b.with("c", Opcode::Call, f32s(&[]), &[x], |i| i.called = vec![add]);
    let e = b.finish("main", c);
    rejects(&b.module(e), "c", "call passes 1 operands to computation %add, which takes 2 parameters");

    let mut b = B::new();
    let add = b.adder("add", T::F32);
    let x = b.param("x", 0, a(T::S32, &[]));
    let c = b.with("c", Opcode::Call, f32s(&[]), &[x, x], |i| i.called = vec![add]);
    let e = b.finish("main", c);
    rejects(&b.module(e), "c", "call operand 0 is s32[], but %add parameter 0 is f32[]");

    let mut b = B::new();
    let add = b.adder("add", T::F32);
    let x = b.param("x", 0, f32s(&[]));
    let c = b.with("c", Opcode::Call, f32s(&[1]), &[x, x], |i| i.called = vec![add]);
    let e = b.finish("main", c);
    rejects(&b.module(e), "c", "call result must be f32[] (the callee's root shape)");
}

#[test]
fn constants_ids_custom_calls() {
    let m = entry(|b| {
        let lit = Array::from_slice(vec![3], &[1.0f32, 2.0, 3.0]);
        b.with("k", Opcode::Constant, f32s(&[4]), &[], |i| i.attrs.literal = Some(lit.into()))
    });
    rejects(&m, "k", "constant literal has shape f32[3], but the instruction's shape is f32[4]");
    let m = entry(|b| b.op("rid", Opcode::ReplicaId, a(T::S32, &[]), &[]));
    rejects(&m, "rid", "replica-id result must be u32[]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("sh", Opcode::CustomCall, a(T::Bf16, &[8]), &[x], |i| {
            i.attrs.custom_call_target = Some("Sharding".into())
        })
    });
    rejects(&m, "sh", "custom-call Sharding must keep the element type, got f32[8] -> bf16[8]");
}

// ------------------------------------------------------------------ collectives

#[test]
fn all_reduce_rules() {
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, a(T::S32, &[8]));
        b.with("ar", Opcode::AllReduce, a(T::S32, &[8]), &[x], |i| i.called = vec![add])
    });
    rejects(&m, "ar", "all-reduce to_apply computation %add parameter 0 must be s32[], got f32[]");
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[8]));
        let y = b.param("y", 1, f32s(&[4]));
        b.with("ar", Opcode::AllReduce, f32s(&[8]), &[x, y], |i| i.called = vec![add])
    });
    rejects(&m, "ar", "all-reduce result must be (f32[8], f32[4])");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.op("ar", Opcode::AllReduce, f32s(&[8]), &[x])
    });
    rejects(&m, "ar", "all-reduce needs exactly one to_apply computation, got 0");
}

#[test]
fn all_gather_rules() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        b.with("ag", Opcode::AllGather, f32s(&[6, 3]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1, 2, 3]]);
        })
    });
    rejects(&m, "ag", "all-gather result dimension 0 must be 8 (operand size 2 x group size 4), got 6");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        b.with("ag", Opcode::AllGather, f32s(&[5, 3]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[]);
        })
    });
    rejects(&m, "ag", "must be a positive multiple of the operand's 2, got 5");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.with("ag", Opcode::AllGather, f32s(&[6]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1], &[2, 3, 4]]);
        })
    });
    rejects(&m, "ag", "all-gather needs replica groups of uniform size, got sizes 2 and 3");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.with("ag", Opcode::AllGather, f32s(&[4]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1], &[1, 2]]);
        })
    });
    rejects(&m, "ag", "lists id 1 more than once");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.with("ag", Opcode::AllGather, f32s(&[4]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = Some(ReplicaGroups::Iota(IotaReplicaGroups {
                num_groups: 2,
                group_size: 2,
                reshape_dims: vec![3],
                transpose_perm: vec![],
            }));
        })
    });
    rejects(&m, "ag", "is not a valid iota form");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        b.with("ag", Opcode::AllGather, f32s(&[4]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, -1]]);
        })
    });
    rejects(&m, "ag", "contains a negative id -1");
}

#[test]
fn all_gather_start_done() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        b.with("ags", Opcode::AllGatherStart, f32s(&[8, 3]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1, 2, 3]]);
        })
    });
    rejects(&m, "ags", "all-gather-start result must be the tuple (operand, gathered)");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2, 3]));
        let s = b.with("ags", Opcode::AllGatherStart, tup(&[f32s(&[2, 3]), f32s(&[8, 3])]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1, 2, 3]]);
        });
        b.op("agd", Opcode::AllGatherDone, f32s(&[2, 3]), &[s])
    });
    rejects(&m, "agd", "all-gather-done result must be f32[8,3]");
}

#[test]
fn all_to_all_rules() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[6, 2]));
        b.with("a2a", Opcode::AllToAll, f32s(&[6, 2]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1, 2, 3]]);
        })
    });
    rejects(&m, "a2a", "split dimension 0 of f32[6,2] (size 6) must be divisible by the group size 4");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("a2a", Opcode::AllToAll, f32s(&[8]), &[x, x], |i| i.attrs.dimensions = Some(vec![0]))
    });
    rejects(&m, "a2a", "all-to-all expects 1 operand, got 2");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.op("a2a", Opcode::AllToAll, f32s(&[8]), &[x, x])
    });
    rejects(&m, "a2a", "all-to-all result must be (f32[8], f32[8])");
}

#[test]
fn reduce_scatter_rules() {
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[6]));
        b.with("rs", Opcode::ReduceScatter, f32s(&[1]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1, 2, 3]]);
            i.called = vec![add];
        })
    });
    rejects(&m, "rs", "reduce-scatter operand dimension 0 (size 6) of f32[6] is not divisible by the group size 4");
    let m = entry_with_adder(|b, add| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("rs", Opcode::ReduceScatter, f32s(&[4]), &[x], |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = groups(&[&[0, 1, 2, 3]]);
            i.called = vec![add];
        })
    });
    rejects(&m, "rs", "reduce-scatter result dimension 0 must be 2 (operand size 8 / group size 4), got 4");
}

#[test]
fn collective_permute_rules() {
    let cp = |pairs: Vec<(i64, i64)>| {
        entry(move |b| {
            let x = b.param("x", 0, f32s(&[8]));
            b.with("cp", Opcode::CollectivePermute, f32s(&[8]), &[x], |i| i.attrs.source_target_pairs = Some(pairs))
        })
    };
    rejects(&cp(vec![(0, 1), (1, 1)]), "cp", "source_target_pairs lists target 1 more than once");
    rejects(&cp(vec![(0, 1), (0, 2)]), "cp", "source_target_pairs lists source 0 more than once");
    rejects(&cp(vec![(0, -1)]), "cp", "negative id");
    accepts(&cp(vec![(0, 1), (1, 0)]));
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.op("cp", Opcode::CollectivePermute, f32s(&[8]), &[x])
    });
    rejects(&m, "cp", "collective-permute needs a source_target_pairs attribute");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("cp", Opcode::CollectivePermute, f32s(&[4]), &[x], |i| i.attrs.source_target_pairs = Some(vec![]))
    });
    rejects(&m, "cp", "collective-permute result must be f32[8]");
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[8]));
        b.with("cps", Opcode::CollectivePermuteStart, tup(&[f32s(&[8]), f32s(&[4])]), &[x], |i| {
            i.attrs.source_target_pairs = Some(vec![(0, 1)])
        })
    });
    rejects(&m, "cps", "collective-permute-start result must be the tuple (f32[8], f32[8])");
}

// ------------------------------------------------------------------ structure

#[test]
fn operand_used_before_definition() {
    let mut b = B::new();
    let x = b.param("x", 0, f32s(&[2]));
    let n = b.op("n", Opcode::Negate, f32s(&[2]), &[x]);
    let late = b.op("late", Opcode::Negate, f32s(&[2]), &[x]);
    b.instrs[n].operands = vec![late];
    let e = b.finish("main", n);
    rejects(&b.module(e), "n", "operand 0 (%late) is used before it is defined");
}

#[test]
fn operand_from_another_computation() {
    let mut b = B::new();
    let add = b.adder("add", T::F32);
    let foreign = b.comps[add].params[0];
    let x = b.param("x", 0, f32s(&[]));
    let n = b.op("n", Opcode::Add, f32s(&[]), &[x, foreign]);
    let e = b.finish("main", n);
    rejects(&b.module(e), "n", "operand 1 (%x) belongs to another computation, not %main");
}

#[test]
fn nonexistent_operand_and_negative_dims() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        let n = b.op("n", Opcode::Negate, f32s(&[2]), &[x]);
        b.instrs[n].operands = vec![InstrId::new(999)];
        n
    });
    rejects(&m, "n", "operand 0 refers to instruction %999, which does not exist");
    let m = entry(|b| b.param("x", 0, f32s(&[-2])));
    rejects(&m, "x", "negative dimension -2");
    let m = entry(|b| b.param("x", 0, f32s(&[1 << 30, 1 << 30, 4])));
    rejects(&m, "x", "more than 2^40 elements");
}

#[test]
fn parameters_numbered_without_gaps() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[2]));
        let y = b.param("y", 2, f32s(&[2]));
        b.op("s", Opcode::Add, f32s(&[2]), &[x, y])
    });
    rejects(&m, "y", "must be numbered 0..2 without gaps or repeats, got {0,2}");
}

#[test]
fn recursion_through_calls() {
    let mut b = B::new();
    // comp0 calls comp1 which calls comp0.
    let x = b.param("x", 0, f32s(&[]));
    let c0 = b.with("c0", Opcode::Call, f32s(&[]), &[x], |i| i.called = vec![CompId::new(1)]);
    let f = b.finish("f", c0);
    let y = b.param("y", 0, f32s(&[]));
    let c1 = b.with("c1", Opcode::Call, f32s(&[]), &[y], |i| i.called = vec![f]);
    let e = b.finish("main", c1);
    let m = b.module(e);
    let err = hlo::verify::verify(&m).unwrap_err();
    assert!(err.message.contains("already on the call stack"), "{}", err.message);
    assert!(err.message.starts_with("%c0: ") || err.message.starts_with("%c1: "), "{}", err.message);
}

#[test]
fn root_and_called_computations_must_exist() {
    let mut m = entry(|b| b.param("x", 0, f32s(&[2])));
    m.comps[m.entry].root = InstrId::new(50);
    let e = hlo::verify::verify(&m).unwrap_err();
    assert!(e.message.contains("root %50 is not one of its instructions"), "{}", e.message);
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[]));
        b.with("c", Opcode::Call, f32s(&[]), &[x], |i| i.called = vec![CompId::new(7)])
    });
    rejects(&m, "c", "calls computation comp7, which does not exist");
}

// ------------------------------------------------------------------ acceptance

#[test]
fn accepts_valid_modules() {
    let mut b = B::new();
    let add = b.adder("add", T::F32);
    // argmax-style variadic reducer.
    let v0 = b.param("v0", 0, f32s(&[]));
    let i0 = b.param("i0", 1, a(T::S32, &[]));
    let v1 = b.param("v1", 2, f32s(&[]));
    let i1 = b.param("i1", 3, a(T::S32, &[]));
    let gt = b.with("gt", Opcode::Compare, a(T::Pred, &[]), &[v0, v1], |i| {
        i.attrs.comparison_direction = Some(ComparisonDirection::Gt)
    });
    let v = b.op("v", Opcode::Select, f32s(&[]), &[gt, v0, v1]);
    let i = b.op("i", Opcode::Select, a(T::S32, &[]), &[gt, i0, i1]);
    let r = b.op("r", Opcode::Tuple, tup(&[f32s(&[]), a(T::S32, &[])]), &[v, i]);
    let argmax = b.finish("argmax", r);

    let x = b.param("x", 0, f32s(&[4, 6]));
    let z = b.param("z", 1, f32s(&[]));
    let pb = b.param("pb", 2, a(T::Pred, &[]));
    let sum = b.with("s", Opcode::Reduce, f32s(&[4]), &[x, z], |i| {
        i.attrs.dimensions = Some(vec![1]);
        i.called = vec![add];
    });
    let io = b.with("io", Opcode::Iota, a(T::S32, &[4, 6]), &[], |i| i.attrs.iota_dimension = Some(1));
    let zi = b.constant("zi", Array::from_slice(Vec::new(), &[0i32]));
    let am = b.with("am", Opcode::Reduce, tup(&[f32s(&[4]), a(T::S32, &[4])]), &[x, io, z, zi], |i| {
        i.attrs.dimensions = Some(vec![1]);
        i.called = vec![argmax];
    });
    let sel = b.op("sel", Opcode::Select, f32s(&[4]), &[pb, sum, sum]);
    let cl = b.op("cl", Opcode::Clamp, f32s(&[4]), &[z, sel, z]);
    let bc = b.op("bc", Opcode::BitcastConvert, a(T::U8, &[4, 4]), &[cl]);
    let bc2 = b.op("bc2", Opcode::BitcastConvert, f32s(&[4]), &[bc]);
    let f8 = b.op("f8", Opcode::Convert, a(T::F8E4M3FN, &[4]), &[bc2]);
    let s4 = b.op("s4", Opcode::Convert, a(T::S4, &[4]), &[f8]);
    let _cp = b.op("cp", Opcode::Copy, a(T::S4, &[4]), &[s4]);
    let br = b.with("br", Opcode::Broadcast, f32s(&[3, 4]), &[cl], |i| i.attrs.dimensions = Some(vec![1]));
    let tr = b.with("tr", Opcode::Transpose, f32s(&[4, 3]), &[br], |i| i.attrs.dimensions = Some(vec![1, 0]));
    let rs = b.op("rs", Opcode::Reshape, f32s(&[12]), &[tr]);
    let sl = b.with("sl", Opcode::Slice, f32s(&[4]), &[rs], |i| i.attrs.slice = Some(vec![sl(1, 12, 3)]));
    let pd = b.with("pd", Opcode::Pad, f32s(&[3]), &[sl, z], |i| {
        i.attrs.padding = Some(vec![PadDim { lo: -1, hi: 0, interior: 0 }])
    });
    let idx = b.constant("idx", Array::from_slice(Vec::new(), &[1u32]));
    let ds =
        b.with("ds", Opcode::DynamicSlice, f32s(&[2]), &[pd, idx], |i| i.attrs.dynamic_slice_sizes = Some(vec![2]));
    let dus = b.op("dus", Opcode::DynamicUpdateSlice, f32s(&[3]), &[pd, ds, idx]);
    let cat = b.with("cat", Opcode::Concatenate, f32s(&[7]), &[dus, sum], |i| i.attrs.dimensions = Some(vec![0]));
    let dot = b.with("dot", Opcode::Dot, f32s(&[4, 4]), &[x, x], |i| i.attrs.dot = dd(&[], &[], &[1], &[1]));
    let ag = b.with("ag", Opcode::AllGather, f32s(&[8, 4]), &[dot], |i| {
        i.attrs.dimensions = Some(vec![0]);
        i.attrs.replica_groups = groups(&[]);
    });
    let ags = b.with(
        "ags",
        Opcode::AllGatherStart,
        tup(&[tup(&[f32s(&[4, 4]), f32s(&[7])]), tup(&[f32s(&[8, 4]), f32s(&[14])])]),
        &[dot, cat],
        |i| {
            i.attrs.dimensions = Some(vec![0]);
            i.attrs.replica_groups = Some(ReplicaGroups::Iota(IotaReplicaGroups {
                num_groups: 2,
                group_size: 2,
                reshape_dims: vec![2, 2],
                transpose_perm: vec![1, 0],
            }));
        },
    );
    let ar = b.with("ar", Opcode::AllReduce, tup(&[f32s(&[8, 4]), f32s(&[7])]), &[ag, cat], |i| {
        i.called = vec![add];
        i.attrs.replica_groups = groups(&[&[0, 1], &[2, 3]]);
        i.attrs.channel_id = Some(1);
    });
    let rsc = b.with("rsc", Opcode::ReduceScatter, f32s(&[2, 4]), &[ag], |i| {
        i.called = vec![add];
        i.attrs.dimensions = Some(vec![0]);
        i.attrs.replica_groups = Some(ReplicaGroups::Iota(IotaReplicaGroups {
            num_groups: 1,
            group_size: 4,
            reshape_dims: vec![4],
            transpose_perm: vec![],
        }));
    });
    let a2a = b.with("a2a", Opcode::AllToAll, f32s(&[2, 4]), &[rsc], |i| {
        i.attrs.dimensions = Some(vec![0]);
        i.attrs.replica_groups = groups(&[&[0, 1], &[2, 3]]);
    });
    let a2t = b.op("a2t", Opcode::AllToAll, tup(&[f32s(&[2, 4]), f32s(&[4])]), &[a2a, sum]);
    let cps = b.with(
        "cps",
        Opcode::CollectivePermuteStart,
        tup(&[f32s(&[4]), f32s(&[4]), a(T::U32, &[]), a(T::U32, &[])]),
        &[sum],
        |i| i.attrs.source_target_pairs = Some(vec![(0, 1), (1, 0)]),
    );
    let cpd = b.op("cpd", Opcode::CollectivePermuteDone, f32s(&[4]), &[cps]);
    let rid = b.op("rid", Opcode::ReplicaId, a(T::U32, &[]), &[]);
    let cc = b.with("cc", Opcode::CustomCall, f32s(&[2, 4]), &[a2a], |i| {
        i.attrs.custom_call_target = Some("SPMDShardToFullShape".into())
    });
    let any = b.with("any", Opcode::CustomCall, tup(&[]), &[cc, rid], |i| {
        i.attrs.custom_call_target = Some("my_kernel".into())
    });
    let g = b.with("g", Opcode::GetTupleElement, f32s(&[7]), &[ar], |i| i.attrs.tuple_index = Some(1));
    let call = b.with("call", Opcode::Call, f32s(&[]), &[z, z], |i| i.called = vec![add]);
    let root = b.op(
        "root",
        Opcode::Tuple,
        tup(&[
            f32s(&[7]),
            f32s(&[]),
            tup(&[f32s(&[4]), a(T::S32, &[4])]),
            tup(&[f32s(&[2, 4]), f32s(&[4])]),
            f32s(&[4]),
            tup(&[]),
            tup(&[tup(&[f32s(&[4, 4]), f32s(&[7])]), tup(&[f32s(&[8, 4]), f32s(&[14])])]),
        ]),
        &[g, call, am, a2t, cpd, any, ags],
    );
    let e = b.finish("main", root);
    accepts(&b.module(e));
}

#[test]
fn unexecuted_ops_get_structure_checks_only() {
    let m = entry(|b| {
        let x = b.param("x", 0, f32s(&[4]));
        // A sort with a nonsense shape is not verified in depth.
        b.with("s", Opcode::Sort, a(T::S8, &[9]), &[x], |i| i.attrs.dimensions = Some(vec![0]))
    });
    accepts(&m);
}

// ------------------------------------------------------------------ through the text parser

/// (source, line, message fragment) rejected by `parse_text` once the parser exists.
const TEXT_CASES: &[(&str, u32, &str)] = &[
    (
        "HloModule m\n\nc {\n  s = f32[4] parameter(0)\n  ROOT z = f32[] constant(0)\n}\n\nb {\n  s = f32[4] parameter(0)\n  ROOT n = f32[4] negate(s)\n}\n\nENTRY main {\n  x = f32[4] parameter(0)\n  ROOT w = f32[4] while(x), condition=c, body=b\n}\n",
        15,
        "must return pred[], returns f32[]",
    ),
    (
        "HloModule m\n\nc {\n  s = f32[4] parameter(0)\n  ROOT z = pred[] constant(false)\n}\n\nb {\n  s = f32[4] parameter(0)\n  ROOT n = f32[2] slice(s), slice={[0:2]}\n}\n\nENTRY main {\n  x = f32[4] parameter(0)\n  ROOT w = f32[4] while(x), condition=c, body=b\n}\n",
        15,
        "must return f32[4], returns f32[2]",
    ),
    (
        "HloModule m\n\nt {\n  s = f32[4] parameter(0)\n  ROOT n = f32[4] negate(s)\n}\n\nENTRY main {\n  p = s8[] parameter(0)\n  x = f32[4] parameter(1)\n  ROOT c = f32[4] conditional(p, x, x), true_computation=t, false_computation=t\n}\n",
        11,
        "selector must be pred[] (two branches) or s32[], got s8[]",
    ),
    (
        "HloModule m\n\nt {\n  s = f32[4] parameter(0)\n  ROOT n = f32[4] negate(s)\n}\n\nENTRY main {\n  p = s32[] parameter(0)\n  x = f32[2] parameter(1)\n  ROOT c = f32[4] conditional(p, x), branch_computations={t}\n}\n",
        11,
        "must take one parameter f32[2], takes (f32[4])",
    ),
    (
        "HloModule m\n\nENTRY main {\n  x = f32[4] parameter(0)\n  y = s32[4] parameter(1)\n  ROOT add.3 = f32[4] add(x, y)\n}\n",
        6,
        "add operands must have the same element type and dimensions, got f32[4] and s32[4]",
    ),
    (
        "HloModule m\n\nENTRY main {\n  x = f32[2,3] parameter(0)\n  ROOT t = f32[3,2] transpose(x), dimensions={0,0}\n}\n",
        5,
        "must be a permutation",
    ),
    (
        "HloModule m\n\nENTRY main {\n  x = f32[2,3] parameter(0)\n  ROOT ag = f32[6,3] all-gather(x), replica_groups={{0,1,2,3}}, dimensions={0}\n}\n",
        5,
        "must be 8 (operand size 2 x group size 4), got 6",
    ),
    (
        "HloModule m\n\nENTRY main {\n  x = f32[2,3] parameter(0)\n  ROOT ags = f32[8,3] all-gather-start(x), replica_groups={{0,1,2,3}}, dimensions={0}\n}\n",
        5,
        "all-gather-start result must be the tuple",
    ),
    (
        "HloModule m\n\nENTRY main {\n  x = f32[8] parameter(0)\n  ROOT cp = f32[8] collective-permute(x), source_target_pairs={{0,1},{2,1}}\n}\n",
        5,
        "lists target 1 more than once",
    ),
    (
        "HloModule m\n\nENTRY main {\n  x = (f32[2], s32[]) parameter(0)\n  ROOT g = f32[2] get-tuple-element(x), index=2\n}\n",
        5,
        "index=2 is out of range",
    ),
    (
        "HloModule m\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n\nENTRY main {\n  x = f32[8] parameter(0)\n  z = f32[] constant(0)\n  ROOT rw = f32[7] reduce-window(x, z), window={size=8 pad=7_0}, to_apply=add\n}\n",
        12,
        "reduce-window result must be f32[8]",
    ),
];

#[test]
fn text_cases() {
    for &(src, line, fragment) in TEXT_CASES {
        let e = match hlo::parse_text("t.hlo", src) {
            Err(e) if e.message.contains("not built yet") => return,
            Err(e) => e,
            Ok(_) => panic!("accepted:\n{src}"),
        };
        assert_eq!(e.line, line, "{e}");
        if e.kind == ErrorKind::Verify {
            assert!(e.message.contains(fragment), "expected {fragment:?} in {e}");
            assert!(e.source_line.is_some(), "{e}");
        } else {
            // The parser may reject some of these itself; it must still point at the line.
            assert_eq!(e.kind, ErrorKind::Parse, "{e}");
        }
    }
}

#[test]
fn text_modules_accepted() {
    let src = "HloModule m, replica_count=4\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n\nENTRY main {\n  p = f32[8] parameter(0)\n  ar = f32[8] all-reduce(p), replica_groups=[2,2]<=[4], to_apply=add\n  ags = (f32[8], f32[32]) all-gather-start(ar), replica_groups={{0,1,2,3}}, dimensions={0}\n  agd = f32[32] all-gather-done(ags)\n  rs = f32[8] reduce-scatter(agd), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add\n  ROOT cp = f32[8] collective-permute(rs), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}\n}\n";
    match hlo::parse_text("ok.hlo", src) {
        Err(e) if e.message.contains("not built yet") => {}
        Err(e) => panic!("{e}"),
        Ok(m) => assert_eq!(m.collectives().len(), 4),
    }
    for name in ["all_reduce_iota", "all_gather_start", "constants", "dot", "reduce", "collectives", "sharding"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{name}.hlo"));
        let src = std::fs::read_to_string(path).unwrap();
        match hlo::parse_text(name, &src) {
            Err(e) if e.message.contains("not built yet") => return,
            Err(e) => panic!("{e}"),
            Ok(_) => {}
        }
    }
}

#[test]
fn sdy_shard_map_custom_calls_are_variadic() {
    let mk = |result: Shape| {
        entry(move |b| {
            let x = b.param("x", 0, f32s(&[2, 4]));
            let y = b.param("y", 1, a(T::S32, &[2]));
            b.with("sm", Opcode::CustomCall, result, &[x, y], |i| {
                i.attrs.custom_call_target = Some("xla.sdy.GlobalToLocalShape".into())
            })
        })
    };
    accepts(&mk(tup(&[f32s(&[1, 4]), a(T::S32, &[1])])));
    rejects(&mk(tup(&[f32s(&[1, 4]), f32s(&[1])])), "sm", "must keep the element type, got s32[2] -> f32[1]");
    rejects(
        &mk(f32s(&[1, 4])),
        "sm",
        "custom-call xla.sdy.GlobalToLocalShape of 2 operand(s) must produce 2 result(s)",
    );
}
