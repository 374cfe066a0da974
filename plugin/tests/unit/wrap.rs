//! Unit tests of `plugin::wrap` (included by path from src/wrap.rs).

use super::*;

fn string_option(name: &'static str, value: &'static str) -> NamedValue {
    // SAFETY: an all-zero PJRT_NamedValue is a valid value (null pointers, zero sizes).
    let mut o: NamedValue = unsafe { std::mem::zeroed() };
    o.struct_size = size_of::<NamedValue>();
    o.name = name.as_ptr().cast();
    o.name_size = name.len();
    o.type_ = pjrt_sys::PJRT_NamedValue_Type_PJRT_NamedValue_kString;
    o.__bindgen_anon_1.string_value = value.as_ptr().cast();
    o.value_size = value.len();
    o
}

#[test]
fn the_flags_create_option_comes_out_and_the_rest_stays() {
    let mut count = string_option("cpu_device_count", "");
    count.type_ = pjrt_sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
    count.__bindgen_anon_1.int64_value = 8;
    let opts = [count, string_option(FLAGS_OPTION, "--one_shot_max_bytes=1024")];
    // SAFETY: the options point into 'static strings of the given sizes.
    let (flags, rest) = unsafe { split_create_options(&opts) }.unwrap();
    assert_eq!(flags.as_deref(), Some("--one_shot_max_bytes=1024"));
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].name_size, "cpu_device_count".len());
    // SAFETY: as above.
    let (none, all) = unsafe { split_create_options(&opts[..1]) }.unwrap();
    assert!(none.is_none() && all.len() == 1);
    let mut bad = string_option(FLAGS_OPTION, "");
    bad.type_ = pjrt_sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
    // SAFETY: as above.
    let Err(e) = (unsafe { split_create_options(&[bad]) }) else { panic!("a non-string flags option") };
    assert!(e.contains("takes a string"), "{e}");
    assert!(crate::xla_inside::set_client_flags("--bogus=1").unwrap_err().contains("bogus"));
}
