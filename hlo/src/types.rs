//! Element types and shapes, spelled exactly as XLA prints them.

use std::fmt;

use crate::print::{array_without_layout, int_list, join};

/// Declares [`PrimitiveType`] from one table: variant, HLO text spelling, bytes per element, number in
/// `xla_data.proto`'s `PrimitiveType` enum.
macro_rules! primitive_types {
    ($(($variant:ident, $name:literal, $bytes:literal, $number:literal),)*) => {
        /// An XLA element type. Names follow `xla_data.proto`'s `PrimitiveType` (the text form is the lower-case
        /// spelling: `f32`, `bf16`, `f8e4m3fn`, ...).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum PrimitiveType { $($variant,)* }

        impl PrimitiveType {
            /// Every type, for tables and round-trip tests.
            pub const ALL: [PrimitiveType; [$($name,)*].len()] = [$(Self::$variant,)*];

            /// The spelling XLA uses in HLO text.
            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $name,)* }
            }

            /// Bytes one element occupies in a Peerless buffer. Sub-byte types (s4/u4) are stored unpacked, one element
            /// per byte, so every type is addressable.
            pub fn byte_size(self) -> usize {
                match self { $(Self::$variant => $bytes,)* }
            }

            /// The number of the type in `xla_data.proto` (`HloModuleProto`'s `element_type`).
            pub fn proto_number(self) -> i32 {
                match self { $(Self::$variant => $number,)* }
            }
        }
    };
}

primitive_types! {
    (Pred, "pred", 1, 1),
    (S4, "s4", 1, 21),
    (S8, "s8", 1, 2),
    (S16, "s16", 2, 3),
    (S32, "s32", 4, 4),
    (S64, "s64", 8, 5),
    (U4, "u4", 1, 22),
    (U8, "u8", 1, 6),
    (U16, "u16", 2, 7),
    (U32, "u32", 4, 8),
    (U64, "u64", 8, 9),
    (F16, "f16", 2, 10),
    (Bf16, "bf16", 2, 16),
    (F32, "f32", 4, 11),
    (F64, "f64", 8, 12),
    (F8E5M2, "f8e5m2", 1, 19),
    (F8E4M3, "f8e4m3", 1, 28),
    (F8E4M3FN, "f8e4m3fn", 1, 20),
    (F8E4M3B11FNUZ, "f8e4m3b11fnuz", 1, 23),
    (F8E5M2FNUZ, "f8e5m2fnuz", 1, 24),
    (F8E4M3FNUZ, "f8e4m3fnuz", 1, 25),
    (F8E3M4, "f8e3m4", 1, 29),
    (F8E8M0FNU, "f8e8m0fnu", 1, 33),
    (C64, "c64", 8, 15),
    (C128, "c128", 16, 18),
    (Token, "token", 0, 17),
}

impl PrimitiveType {
    /// Parses the HLO text spelling.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name() == s)
    }

    pub fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::Bf16 | Self::F32 | Self::F64) || self.is_f8()
    }

    /// The 8-bit float types, every one spelled `f8...`.
    pub fn is_f8(self) -> bool {
        self.name().starts_with("f8")
    }

    pub fn is_integral(self) -> bool {
        use PrimitiveType::*;
        matches!(self, S4 | S8 | S16 | S32 | S64 | U4 | U8 | U16 | U32 | U64)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, Self::C64 | Self::C128)
    }

    /// Types Peerless computes with (arithmetic, reductions, collective kernels). F8 variants, s4/u4 and complex types
    /// can be stored and moved, never computed on.
    pub fn is_computable(self) -> bool {
        !(self.is_f8() || self.is_complex() || matches!(self, Self::S4 | Self::U4 | Self::Token))
    }
}

impl fmt::Display for PrimitiveType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense array shape: element type, logical dimensions and (optional) layout. Layouts are kept for printing; Peerless
/// buffers are always row-major (the logical dimension order, major to minor).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArrayShape {
    pub ty: PrimitiveType,
    pub dims: Vec<i64>,
    /// `minor_to_major` as written in `{1,0}`, when the text or proto gave one.
    pub layout: Option<Vec<i64>>,
}

impl ArrayShape {
    pub fn new(ty: PrimitiveType, dims: Vec<i64>) -> Self {
        ArrayShape { ty, dims, layout: None }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements (1 for a scalar). Saturates at `usize::MAX` instead of overflowing (unverified shapes may be
    /// absurd; the verifier bounds verified ones to 2^40 elements).
    pub fn element_count(&self) -> usize {
        self.dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d.max(0) as usize)).unwrap_or(usize::MAX)
    }

    /// Bytes of a row-major Peerless buffer holding this shape (saturating).
    pub fn byte_size(&self) -> usize {
        self.element_count().saturating_mul(self.ty.byte_size())
    }

    /// Same element type and dimensions; layouts are ignored.
    pub fn compatible(&self, other: &ArrayShape) -> bool {
        self.ty == other.ty && self.dims == other.dims
    }
}

impl fmt::Display for ArrayShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&array_without_layout(self))?;
        self.layout.as_ref().map_or(Ok(()), |layout| f.write_str(&int_list(layout)))
    }
}

/// The shape of an HLO value: an array, a tuple of shapes, or a token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    Array(ArrayShape),
    Tuple(Vec<Shape>),
    Token,
}

impl Shape {
    pub fn array(ty: PrimitiveType, dims: Vec<i64>) -> Self {
        Shape::Array(ArrayShape::new(ty, dims))
    }

    pub fn as_array(&self) -> Option<&ArrayShape> {
        match self {
            Shape::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn tuple_elements(&self) -> Option<&[Shape]> {
        match self {
            Shape::Tuple(t) => Some(t),
            _ => None,
        }
    }

    pub fn is_tuple(&self) -> bool {
        matches!(self, Shape::Tuple(_))
    }

    /// Same structure, element types and dimensions; layouts are ignored.
    pub fn compatible(&self, other: &Shape) -> bool {
        match (self, other) {
            (Shape::Array(a), Shape::Array(b)) => a.compatible(b),
            (Shape::Tuple(a), Shape::Tuple(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.compatible(y)),
            (Shape::Token, Shape::Token) => true,
            _ => false,
        }
    }

    /// Array leaves in depth-first order (the order of flattened entry results).
    pub fn leaves(&self) -> Vec<&ArrayShape> {
        match self {
            Shape::Array(a) => vec![a],
            Shape::Tuple(t) => t.iter().flat_map(Shape::leaves).collect(),
            Shape::Token => Vec::new(),
        }
    }

    /// Total bytes of all array leaves.
    pub fn byte_size(&self) -> usize {
        self.leaves().iter().fold(0usize, |acc, a| acc.saturating_add(a.byte_size()))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Array(a) => a.fmt(f),
            Shape::Token => f.write_str("token[]"),
            Shape::Tuple(t) => write!(f, "({})", join(t, ", ")),
        }
    }
}
