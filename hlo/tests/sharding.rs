//! `hlo::sharding`: each device's entry arguments in partition mode.

use hlo::sharding::param_shapes;
use hlo::{ErrorKind, parse_text};

const TRANSPOSE: &str = "HloModule m, num_partitions=2\nENTRY e {\n  a = f32[5,2] parameter(0), sharding={devices=[2,1]<=[2]}\n  ROOT t = f32[2,5] transpose(a), dimensions={1,0}\n}\n";

#[test]
fn a_sharded_parameter_holds_its_padded_shard() {
    let m = parse_text("t.hlo", TRANSPOSE).unwrap();
    // Uneven: 5 rows over 2 tiles is 3 rows a shard, the last one padded.
    assert_eq!(param_shapes(&m, 2).unwrap()[0].to_string(), "f32[3,2]");
}

#[test]
fn a_sharding_that_does_not_fit_names_its_instruction() {
    let m = parse_text("t.hlo", TRANSPOSE).unwrap();
    let e = param_shapes(&m, 4).unwrap_err();
    assert_eq!((e.kind, e.instr), (ErrorKind::Sharding, Some(m.entry().params[0])));
    assert_eq!(e.reason(&m), "sharding spans 2 devices, running on 4");
    assert!(e.to_string().starts_with("t.hlo:3:3: invalid sharding: %a in e: sharding spans"), "{e}");
}
