//! Host values: dense arrays of raw little-endian bytes, and tuples of them.
//!
//! One representation serves constants in the IR, npz I/O and the values the CLI hands XLA and reads back, so values
//! move between them without conversion.

use crate::types::{ArrayShape, PrimitiveType, Shape};

/// A dense row-major array. `data.len() == shape.byte_size()` always holds (checked by [`Array::new`]); s4/u4 hold one
/// element per byte, pred one byte (0/1).
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub shape: ArrayShape,
    pub data: Vec<u8>,
}

/// A value: an array or a tuple of values.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Array(Array),
    Tuple(Vec<Literal>),
    Token,
}

/// Native element types an [`Array`] can be viewed as.
pub trait Element: Copy + Default + 'static {
    const TYPE: PrimitiveType;
    fn from_le(bytes: &[u8]) -> Self;
    fn write_le(self, out: &mut [u8]);
}

macro_rules! element {
    ($t:ty, $pt:expr) => {
        impl Element for $t {
            const TYPE: PrimitiveType = $pt;
            fn from_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(&bytes[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(b)
            }
            fn write_le(self, out: &mut [u8]) {
                out[..std::mem::size_of::<$t>()].copy_from_slice(&self.to_le_bytes());
            }
        }
    };
}
element!(i8, PrimitiveType::S8);
element!(i16, PrimitiveType::S16);
element!(i32, PrimitiveType::S32);
element!(i64, PrimitiveType::S64);
element!(u8, PrimitiveType::U8);
element!(u16, PrimitiveType::U16);
element!(u32, PrimitiveType::U32);
element!(u64, PrimitiveType::U64);
element!(half::f16, PrimitiveType::F16);
element!(half::bf16, PrimitiveType::Bf16);
element!(f32, PrimitiveType::F32);
element!(f64, PrimitiveType::F64);

impl Element for bool {
    const TYPE: PrimitiveType = PrimitiveType::Pred;
    fn from_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn write_le(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
}

/// Error for an array whose byte length does not match its shape.
#[derive(Debug, thiserror::Error)]
#[error("array of shape {shape} needs {expected} bytes, got {actual}")]
pub struct SizeMismatch {
    pub shape: ArrayShape,
    pub expected: usize,
    pub actual: usize,
}

impl Array {
    pub fn new(shape: ArrayShape, data: Vec<u8>) -> Result<Self, SizeMismatch> {
        let expected = shape.byte_size();
        if data.len() != expected {
            return Err(SizeMismatch { shape, expected, actual: data.len() });
        }
        Ok(Array { shape, data })
    }

    pub fn from_slice<T: Element>(dims: Vec<i64>, values: &[T]) -> Self {
        let shape = ArrayShape::new(T::TYPE, dims);
        assert_eq!(shape.element_count(), values.len(), "from_slice: element count");
        let size = T::TYPE.byte_size();
        let mut data = vec![0u8; values.len() * size];
        for (i, v) in values.iter().enumerate() {
            v.write_le(&mut data[i * size..(i + 1) * size]);
        }
        Array { shape, data }
    }

    pub fn ty(&self) -> PrimitiveType {
        self.shape.ty
    }

    pub fn dims(&self) -> &[i64] {
        &self.shape.dims
    }

    pub fn element_count(&self) -> usize {
        self.shape.element_count()
    }

    /// Copies out the elements as `T`. Returns `None` if `T` is not the element type.
    pub fn to_vec<T: Element>(&self) -> Option<Vec<T>> {
        if T::TYPE != self.shape.ty {
            return None;
        }
        let size = T::TYPE.byte_size();
        Some(self.data.chunks_exact(size).map(T::from_le).collect())
    }

    /// The raw bytes of element `i` (row-major index).
    pub fn element_bytes(&self, i: usize) -> &[u8] {
        let size = self.shape.ty.byte_size();
        &self.data[i * size..(i + 1) * size]
    }
}

impl Literal {
    pub fn shape(&self) -> Shape {
        match self {
            Literal::Array(a) => Shape::Array(a.shape.clone()),
            Literal::Tuple(t) => Shape::Tuple(t.iter().map(Literal::shape).collect()),
            Literal::Token => Shape::Token,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Literal::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Array leaves in depth-first order.
    pub fn leaves(&self) -> Vec<&Array> {
        match self {
            Literal::Array(a) => vec![a],
            Literal::Tuple(t) => t.iter().flat_map(Literal::leaves).collect(),
            Literal::Token => Vec::new(),
        }
    }
}

impl From<Array> for Literal {
    fn from(a: Array) -> Self {
        Literal::Array(a)
    }
}
