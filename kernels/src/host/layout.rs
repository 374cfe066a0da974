//! Where the pieces of an operand lie when a collective splits or concatenates it along a dimension. Buffers are
//! row-major, so a block along dimension `d > 0` is not contiguous: it is `outer` runs of bytes, one per index of the
//! dimensions before `d`.

use hlo::ArrayShape;

/// `rows` runs of `row` bytes each, `stride` bytes apart, the first `offset` bytes into a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Runs {
    pub offset: usize,
    pub rows: usize,
    pub row: usize,
    pub stride: usize,
}

impl Runs {
    /// Start offset of every non-empty run when the buffer begins at `base`.
    pub(crate) fn starts(self, base: usize) -> impl Iterator<Item = usize> {
        let rows = if self.row == 0 { 0 } else { self.rows };
        (0..rows).map(move |r| base + self.offset + r * self.stride)
    }
}

/// An operand viewed along one dimension `d`: `outer` rows (the product of the dimensions before `d`), each holding `n`
/// (= `dims[d]`) slices of `inner` bytes (the product of the dimensions after `d`, times the element size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    outer: usize,
    n: usize,
    inner: usize,
}

fn product(dims: &[i64]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
}

/// Bytes of a row-major buffer of `shape`, or `None` for negative dimensions or overflow.
pub(crate) fn shape_bytes(shape: &ArrayShape) -> Option<usize> {
    product(&shape.dims)?.checked_mul(shape.ty.byte_size())
}

impl Split {
    /// Views `shape` (whose buffer is `len` bytes) along `dim`.
    pub(crate) fn new(shape: &ArrayShape, dim: usize, len: usize) -> Result<Self, String> {
        let elem = shape.ty.byte_size();
        if shape_bytes(shape) != Some(len) {
            return Err(format!("operand shape {shape} does not match its {len}-byte region"));
        }
        let Some(&n) = shape.dims.get(dim) else {
            return Err(format!("dimension {dim} is out of range for operand shape {shape}"));
        };
        // Every product below divides `len`, which fits in usize.
        let outer = product(&shape.dims[..dim]).unwrap_or(0);
        let inner = product(&shape.dims[dim + 1..]).unwrap_or(0) * elem;
        Ok(Split { outer, n: usize::try_from(n).unwrap_or(0), inner })
    }

    /// The whole operand, as `outer` runs of one row each.
    pub(crate) fn whole(self) -> Runs {
        self.gathered(1, 0)
    }

    /// Where member `i`'s operand lands in an all-gather result of `g` operands concatenated along the dimension.
    pub(crate) fn gathered(self, g: usize, i: usize) -> Runs {
        let row = self.n * self.inner;
        Runs { offset: i * row, rows: self.outer, row, stride: g * row }
    }

    /// The view again if the dimension splits into `g` equal blocks, else why not.
    pub(crate) fn check_blocks(self, g: usize, shape: &ArrayShape, dim: usize) -> Result<Self, String> {
        if g == 0 || !self.n.is_multiple_of(g) {
            return Err(format!("dimension {dim} of operand shape {shape} does not split into {g} blocks"));
        }
        Ok(self)
    }

    /// Block `k` of `g` along the dimension (after [`Split::check_blocks`]).
    pub(crate) fn block(self, g: usize, k: usize) -> Runs {
        let c = self.n / g.max(1);
        Runs { offset: k * c * self.inner, rows: self.outer, row: c * self.inner, stride: self.n * self.inner }
    }

    /// One block of `g`, packed densely (a reduce-scatter result).
    pub(crate) fn block_dense(self, g: usize) -> Runs {
        let row = self.n / g.max(1) * self.inner;
        Runs { offset: 0, rows: self.outer, row, stride: row }
    }
}

#[cfg(test)]
#[path = "../../tests/unit/layout.rs"]
mod tests;
