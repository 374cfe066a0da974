//! HLO opcodes. Every opcode XLA can print is known to the parser; the ones Peerless does not execute still parse (so
//! `check` can describe a real dump) and are rejected later with an error that names them.

use std::fmt;

macro_rules! opcodes {
    ($($variant:ident => $name:literal,)*) => {
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
    Negate => "negate",
    Abs => "abs",
    Exp => "exponential",
    Expm1 => "exponential-minus-one",
    Log => "log",
    Log1p => "log-plus-one",
    Sqrt => "sqrt",
    Rsqrt => "rsqrt",
    Cbrt => "cbrt",
    Tanh => "tanh",
    Logistic => "logistic",
    Floor => "floor",
    Ceil => "ceil",
    RoundNearestAfz => "round-nearest-afz",
    RoundNearestEven => "round-nearest-even",
    Sign => "sign",
    Not => "not",
    Sine => "sine",
    Cosine => "cosine",
    Tan => "tan",
    IsFinite => "is-finite",
    PopulationCount => "popcnt",
    CountLeadingZeros => "clz",
    Real => "real",
    Imag => "imag",
    // Binary elementwise.
    Add => "add",
    Subtract => "subtract",
    Multiply => "multiply",
    Divide => "divide",
    Maximum => "maximum",
    Minimum => "minimum",
    Power => "power",
    Remainder => "remainder",
    And => "and",
    Or => "or",
    Xor => "xor",
    ShiftLeft => "shift-left",
    ShiftRightArithmetic => "shift-right-arithmetic",
    ShiftRightLogical => "shift-right-logical",
    Atan2 => "atan2",
    Complex => "complex",
    Compare => "compare",
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
    AllReduce => "all-reduce",
    AllReduceStart => "all-reduce-start",
    AllReduceDone => "all-reduce-done",
    AllGather => "all-gather",
    AllGatherStart => "all-gather-start",
    AllGatherDone => "all-gather-done",
    AllToAll => "all-to-all",
    RaggedAllToAll => "ragged-all-to-all",
    ReduceScatter => "reduce-scatter",
    CollectivePermute => "collective-permute",
    CollectivePermuteStart => "collective-permute-start",
    CollectivePermuteDone => "collective-permute-done",
    CollectiveBroadcast => "collective-broadcast",
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
    Erf => "erf",
    StochasticConvert => "stochastic-convert",
    TopK => "topk",
}

impl Opcode {
    /// Collective operations (including async halves), which the emitter decides on.
    pub fn is_collective(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            AllReduce
                | AllReduceStart
                | AllGather
                | AllGatherStart
                | AllToAll
                | RaggedAllToAll
                | ReduceScatter
                | CollectivePermute
                | CollectivePermuteStart
                | CollectiveBroadcast
        )
    }

    /// Elementwise ops of one operand.
    pub fn is_elementwise_unary(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            Negate
                | Abs
                | Exp
                | Expm1
                | Log
                | Log1p
                | Sqrt
                | Rsqrt
                | Cbrt
                | Tanh
                | Logistic
                | Floor
                | Ceil
                | RoundNearestAfz
                | RoundNearestEven
                | Sign
                | Not
                | Sine
                | Cosine
                | Tan
                | IsFinite
                | PopulationCount
                | CountLeadingZeros
                | Erf
                | Real
                | Imag
        )
    }

    /// Elementwise ops of two operands (compare included).
    pub fn is_elementwise_binary(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            Add | Subtract
                | Multiply
                | Divide
                | Maximum
                | Minimum
                | Power
                | Remainder
                | And
                | Or
                | Xor
                | ShiftLeft
                | ShiftRightArithmetic
                | ShiftRightLogical
                | Atan2
                | Complex
                | Compare
        )
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
