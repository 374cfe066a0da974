//! `plugin::wrap::split_compile_options`: Peerless's options come out of XLA's compile
//! options, and the rest stays as it was.

use std::collections::HashMap;

use pjrt_sys::protos::xla;
use prost::Message;

use plugin::wrap::split_compile_options;

fn options(overrides: &[(&str, &str)]) -> Vec<u8> {
    let env_option_overrides: HashMap<String, xla::OptionOverrideProto> = overrides
        .iter()
        .map(|(k, v)| {
            let value = Some(xla::option_override_proto::Value::StringField((*v).into()));
            ((*k).to_owned(), xla::OptionOverrideProto { value })
        })
        .collect();
    xla::CompileOptionsProto { env_option_overrides, parameter_is_tupled_arguments: true, ..Default::default() }
        .encode_to_vec()
}

#[test]
fn options_without_peerless_ones_pass_untouched() {
    assert_eq!(split_compile_options(&options(&[])).unwrap(), None);
    assert_eq!(split_compile_options(&options(&[("xla_embed_ir_in_executable", "true")])).unwrap(), None);
    assert_eq!(split_compile_options(&options(&[("invalid_key", "x")])).unwrap(), None);
    assert_eq!(split_compile_options(&[]).unwrap(), None);
}

#[test]
fn peerless_options_come_out_and_the_rest_stays() {
    let bytes = options(&[
        ("all_reduce_backend", "fallback"),
        ("xla_embed_ir_in_executable", "true"),
        ("peerless_flags", "--one_shot_max_bytes=1024 --all_gather_backend=kernel"),
    ]);
    let (mut flags, rest) = split_compile_options(&bytes).unwrap().unwrap();
    flags.sort();
    assert_eq!(flags, ["--all_gather_backend=kernel", "--all_reduce_backend=fallback", "--one_shot_max_bytes=1024"]);
    let left = xla::CompileOptionsProto::decode(rest.as_slice()).unwrap();
    assert!(left.parameter_is_tupled_arguments);
    assert_eq!(left.env_option_overrides.keys().collect::<Vec<_>>(), ["xla_embed_ir_in_executable"]);
}

#[test]
fn a_bad_peerless_option_is_an_error_naming_it() {
    let e = split_compile_options(&options(&[("all_reduce_backend", "bogus")])).unwrap_err();
    assert!(e.contains("all_reduce_backend=bogus"), "{e}");
    let e = split_compile_options(&options(&[("peerless_flags", "--nope=1")])).unwrap_err();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn unknown_fields_survive_the_edit() {
    // Field 999 (varint) is unknown to this build's CompileOptionsProto.
    let mut bytes = options(&[("all_reduce_backend", "kernel")]);
    prost::encoding::encode_key(999, prost::encoding::WireType::Varint, &mut bytes);
    prost::encoding::encode_varint(42, &mut bytes);
    let (_, rest) = split_compile_options(&bytes).unwrap().unwrap();
    let mut tail = Vec::new();
    prost::encoding::encode_key(999, prost::encoding::WireType::Varint, &mut tail);
    prost::encoding::encode_varint(42, &mut tail);
    assert!(rest.ends_with(&tail));
}
