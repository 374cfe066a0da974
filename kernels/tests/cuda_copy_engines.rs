//! The copy-engine collectives on a real GPU, members sharing GPU 0 (each with a stream of its
//! own), through the XLA runtime's own plans (`kernels::cuda::one_gpu`). Ignored by default:
//! they need an NVIDIA GPU (`cargo test -p peerless-kernels --test cuda_copy_engines --
//! --ignored`; `PEERLESS_TEST_RANKS_ON_ONE_GPU=N` picks one member count, else 2, 3 and 4).

use kernels::cuda::one_gpu;
use thunks::CollectiveKind as Kind;

const ALL_KINDS: [Kind; 5] =
    [Kind::AllGather, Kind::AllToAll, Kind::CollectivePermute, Kind::ReduceScatter, Kind::AllReduce];

fn member_counts() -> Vec<usize> {
    match std::env::var("PEERLESS_TEST_RANKS_ON_ONE_GPU").ok().and_then(|v| v.parse().ok()) {
        Some(n) => vec![n],
        None => vec![2, 3, 4],
    }
}

/// Every form, element type and algorithm equal to the host reference bit for bit (so the
/// copy engines equal today's kernels; the reductions: bit for bit today's kernels for every
/// type and reduction, and exact f32 sums), eagerly and over 1,000 graph replays with fresh
/// operands; and no copy-engine all-gather, all-to-all or permute launches a kernel.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn copy_engines_equal_the_reference_and_the_kernels() {
    for n in member_counts() {
        let checked = one_gpu::check(n, 1000, false, &ALL_KINDS, &mut |l| eprintln!("{n} members: {l}")).unwrap();
        assert_eq!(checked.ce_launches, 0, "copy-engine forms launch no kernel");
        assert!(checked.eager > 0 && checked.replays >= 1000, "{checked:?}");
    }
}

/// A member that never comes ends in DEADLINE_EXCEEDED naming it, never a hung stream.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_missing_member_is_a_timeout_naming_it() {
    for n in member_counts() {
        for e in one_gpu::check_missing_member(n).unwrap() {
            eprintln!("{n} members: {e}");
        }
    }
}
