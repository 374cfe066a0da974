use super::*;

#[test]
fn a_profile_decides_only_for_its_device_kind() {
    assert!(kind_fits("NVIDIA H200", Some("NVIDIA H200")));
    assert!(!kind_fits("NVIDIA H200", Some("NVIDIA A100-SXM4-80GB")));
    // Unknown on either side: a profile from before the key named GPUs, or no probe.
    assert!(kind_fits("gpu", Some("NVIDIA H200")));
    assert!(kind_fits("NVIDIA H200", None));
}
