//! `plugin::xla_inside::run_pass`: malformed modules, unknown platforms and bad flags are
//! errors (status -1 and a report), never a crash.

use plugin::xla_inside::run_pass;

#[test]
fn garbage_is_an_error_not_a_crash() {
    let (status, module, report) = run_pass("cpu", &[0x0a, 0xff, 0xff], "", "");
    assert_eq!(status, -1);
    assert!(module.is_none());
    assert!(report.contains("malformed"), "{report}");
    let (status, _, report) = run_pass("tpu", &[], "", "");
    assert_eq!(status, -1);
    assert!(report.contains("no handlers for platform 'tpu'"), "{report}");
    let (status, _, report) = run_pass("cpu", &[], "--bogus=1", "");
    assert_eq!(status, -1);
    assert!(report.contains("bogus"), "{report}");
}
