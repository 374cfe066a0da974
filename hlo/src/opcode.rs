//! HLO opcodes. Every opcode XLA can print is known to the parser; the ones Peerless does not execute still parse (so
//! `check` can describe a real dump) and are rejected later with an error that names them.

use std::fmt;

/// What the opcode table says of an opcode besides its spelling.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Other,
    Unary,
    Binary,
    Collective,
}

/// An entry's kind: the word after its spelling, `Other` when there is none.
macro_rules! kind {
    () => {
        Kind::Other
    };
    ($kind:ident) => {
        Kind::$kind
    };
}

/// Declares [`Opcode`] from one table: variant, HLO text spelling and, for elementwise ops and collectives, its kind.
macro_rules! opcodes {
    ($($variant:ident => $name:literal $($kind:ident)?,)*) => {
        /// An HLO opcode, spelled as XLA prints it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Opcode { $($variant,)* }

        impl Opcode {
            /// Every opcode, in declaration order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$variant,)*];

            /// The spelling used in HLO text.
            pub fn name(self) -> &'static str {
                match self { $(Opcode::$variant => $name,)* }
            }

            /// Parses the HLO text spelling.
            pub fn from_name(s: &str) -> Option<Opcode> {
                match s { $($name => Some(Opcode::$variant),)* _ => None }
            }

            fn kind(self) -> Kind {
                match self { $(Opcode::$variant => kind!($($kind)?),)* }
            }
        }
    };
}

opcodes! {
    // Data and structure.
    Parameter => "parameter",
    Constant => "constant",
    Tuple => "tuple",
    GetTupleElement => "get-tuple-element",
    Copy => "copy",
    CopyStart => "copy-start",
    CopyDone => "copy-done",
    Bitcast => "bitcast",
    Reshape => "reshape",
    Broadcast => "broadcast",
    Transpose => "transpose",
    Slice => "slice",
    DynamicSlice => "dynamic-slice",
    DynamicUpdateSlice => "dynamic-update-slice",
    Concatenate => "concatenate",
    Pad => "pad",
    Iota => "iota",
    Convert => "convert",
    BitcastConvert => "bitcast-convert",
    Reverse => "reverse",
    // Unary elementwise.
    Negate => "negate" Unary,
    Abs => "abs" Unary,
    Exp => "exponential" Unary,
    Expm1 => "exponential-minus-one" Unary,
    Log => "log" Unary,
    Log1p => "log-plus-one" Unary,
    Sqrt => "sqrt" Unary,
    Rsqrt => "rsqrt" Unary,
    Cbrt => "cbrt" Unary,
    Tanh => "tanh" Unary,
    Logistic => "logistic" Unary,
    Floor => "floor" Unary,
    Ceil => "ceil" Unary,
    RoundNearestAfz => "round-nearest-afz" Unary,
    RoundNearestEven => "round-nearest-even" Unary,
    Sign => "sign" Unary,
    Not => "not" Unary,
    Sine => "sine" Unary,
    Cosine => "cosine" Unary,
    Tan => "tan" Unary,
    IsFinite => "is-finite" Unary,
    PopulationCount => "popcnt" Unary,
    CountLeadingZeros => "clz" Unary,
    Real => "real" Unary,
    Imag => "imag" Unary,
    // Binary elementwise.
    Add => "add" Binary,
    Subtract => "subtract" Binary,
    Multiply => "multiply" Binary,
    Divide => "divide" Binary,
    Maximum => "maximum" Binary,
    Minimum => "minimum" Binary,
    Power => "power" Binary,
    Remainder => "remainder" Binary,
    And => "and" Binary,
    Or => "or" Binary,
    Xor => "xor" Binary,
    ShiftLeft => "shift-left" Binary,
    ShiftRightArithmetic => "shift-right-arithmetic" Binary,
    ShiftRightLogical => "shift-right-logical" Binary,
    Atan2 => "atan2" Binary,
    Complex => "complex" Binary,
    Compare => "compare" Binary,
    // Ternary.
    Select => "select",
    Clamp => "clamp",
    // Reductions and linear algebra.
    Reduce => "reduce",
    ReduceWindow => "reduce-window",
    Dot => "dot",
    Convolution => "convolution",
    // Control.
    Call => "call",
    While => "while",
    Conditional => "conditional",
    Fusion => "fusion",
    CustomCall => "custom-call",
    AfterAll => "after-all",
    OptimizationBarrier => "opt-barrier",
    AddDependency => "add-dependency",
    // Ids.
    ReplicaId => "replica-id",
    PartitionId => "partition-id",
    // Collectives.
    AllReduce => "all-reduce" Collective,
    AllReduceStart => "all-reduce-start" Collective,
    AllReduceDone => "all-reduce-done",
    AllGather => "all-gather" Collective,
    AllGatherStart => "all-gather-start" Collective,
    AllGatherDone => "all-gather-done",
    AllToAll => "all-to-all" Collective,
    RaggedAllToAll => "ragged-all-to-all" Collective,
    ReduceScatter => "reduce-scatter" Collective,
    CollectivePermute => "collective-permute" Collective,
    CollectivePermuteStart => "collective-permute-start" Collective,
    CollectivePermuteDone => "collective-permute-done",
    CollectiveBroadcast => "collective-broadcast" Collective,
    AsyncStart => "async-start",
    AsyncUpdate => "async-update",
    AsyncDone => "async-done",
    Send => "send",
    SendDone => "send-done",
    Recv => "recv",
    RecvDone => "recv-done",
    // Other XLA ops Peerless parses but does not execute.
    Gather => "gather",
    Scatter => "scatter",
    Sort => "sort",
    Map => "map",
    Rng => "rng",
    RngBitGenerator => "rng-bit-generator",
    RngGetAndUpdateState => "rng-get-and-update-state",
    SelectAndScatter => "select-and-scatter",
    ReducePrecision => "reduce-precision",
    BatchNormTraining => "batch-norm-training",
    BatchNormInference => "batch-norm-inference",
    BatchNormGrad => "batch-norm-grad",
    Cholesky => "cholesky",
    TriangularSolve => "triangular-solve",
    Fft => "fft",
    GetDimensionSize => "get-dimension-size",
    SetDimensionSize => "set-dimension-size",
    Domain => "domain",
    Infeed => "infeed",
    Outfeed => "outfeed",
    Erf => "erf" Unary,
    StochasticConvert => "stochastic-convert",
    TopK => "topk",
}

impl Opcode {
    /// Collective operations (including async halves), which the emitter decides on.
    pub fn is_collective(self) -> bool {
        self.kind() == Kind::Collective
    }

    /// Elementwise ops of one operand.
    pub fn is_elementwise_unary(self) -> bool {
        self.kind() == Kind::Unary
    }

    /// Elementwise ops of two operands (compare included).
    pub fn is_elementwise_binary(self) -> bool {
        self.kind() == Kind::Binary
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
