//! The fused all-reduce + RMSNorm kernel's summation order, for the tests that reproduce it on the host
//! (kernels/tests/epilogue.rs, cuda_collectives.rs).

/// The row's sum of squares in the order of the GPU kernel (`pl_one_shot_norm_*` in
/// kernels/cuda/collectives.cu) launched with `threads` threads a block (a power of two), the
/// row read in units of `unit` elements (16 bytes of the all-reduce's type): thread t sums the
/// squares of units t, t + threads, t + 2 threads, ... left to right, each unit's elements in
/// order, then the threads' sums are added as a tree (t += t + s for s = threads / 2, ..., 1).
pub fn block_sum_of_squares(hf: &[f32], threads: usize, unit: usize) -> f32 {
    let units: Vec<&[f32]> = hf.chunks(unit.max(1)).collect();
    let mut part: Vec<f32> = (0..threads)
        .map(|t| units.iter().skip(t).step_by(threads).flat_map(|u| u.iter()).fold(0f32, |acc, v| acc + v * v))
        .collect();
    let mut s = threads / 2;
    while s > 0 {
        for t in 0..s {
            part[t] += part[t + s];
        }
        s /= 2;
    }
    part.first().copied().unwrap_or(0.0)
}
