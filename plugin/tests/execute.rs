//! Compile + Execute through the runtime in the shapes JAX does not reach in the pytest suite:
//! replica mode (num_replicas = N, one argument list per replica, the way pre-shard_map pmap
//! and other frameworks run) with a permuted device assignment, compile-option flag
//! overrides, and argument errors. Results are checked against the reference interpreter,
//! itself checked against XLA's CPU backend (hlo-tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hlo::{Array, ArrayShape, Literal, PrimitiveType};
use plugin::pjrt_sys::protos::xla;
use plugin::runtime::{Buffer, Client, ClientConfig, Compiled, compile};
use prost::Message;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hlo/tests/fixtures/all_reduce_iota.pb");

fn client(n: i64) -> Box<Client> {
    Client::new(ClientConfig::new(Some(n), None).expect("config"))
}

fn options(replicas: i64, assignment: &[i64], overrides: &[(&str, &str)]) -> Vec<u8> {
    use xla::option_override_proto::Value;
    let device_assignment = xla::DeviceAssignmentProto {
        replica_count: replicas as i32,
        computation_count: 1,
        computation_devices: vec![xla::device_assignment_proto::ComputationDevice {
            replica_device_ids: assignment.to_vec(),
        }],
    };
    let env_option_overrides: HashMap<String, xla::OptionOverrideProto> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), xla::OptionOverrideProto { value: Some(Value::StringField(v.to_string())) }))
        .collect();
    xla::CompileOptionsProto {
        executable_build_options: Some(xla::ExecutableBuildOptionsProto {
            num_replicas: replicas,
            num_partitions: 1,
            device_assignment: Some(device_assignment),
            ..Default::default()
        }),
        env_option_overrides,
        ..Default::default()
    }
    .encode_to_vec()
}

fn input(d: usize) -> Array {
    let vals: Vec<f32> = (0..8).map(|i| (d * 10 + i) as f32 * 0.5 - 3.0).collect();
    Array::new(ArrayShape::new(PrimitiveType::F32, vec![8]), vals.iter().flat_map(|v| v.to_le_bytes()).collect())
        .expect("array")
}

fn buffer(c: &Client, device: usize, a: &Array) -> Buffer {
    Buffer {
        client: std::ptr::from_ref(c),
        device,
        shape: a.shape.clone(),
        data: Mutex::new(Some(Arc::new(a.clone()))),
    }
}

/// Runs `compiled` on per-replica inputs placed on the assigned devices; returns each
/// replica's output and the interpreter's.
fn run_both(c: &Client, compiled: &Compiled) -> (Vec<Plain>, Vec<Plain>) {
    let n = compiled.devices.len();
    let inputs: Vec<Array> = (0..n).map(input).collect();
    let bufs: Vec<Buffer> = (0..n).map(|r| buffer(c, compiled.devices[r], &inputs[r])).collect();
    let args: Vec<Vec<&Buffer>> = bufs.iter().map(|b| vec![b]).collect();
    let got = compiled.execute(&args).expect("execute");
    let module = hlo::decode_proto("fixture", &std::fs::read(FIXTURE).unwrap()).unwrap();
    let cfg = interp::RunConfig { num_devices: n, mode: interp::Mode::Replica };
    let lits: Vec<Vec<Literal>> = inputs.iter().map(|a| vec![Literal::Array(a.clone())]).collect();
    let want = interp::run(&module, &cfg, &lits).expect("interp");
    let got = got.into_iter().map(|row| plain(&row[0])).collect();
    let want = want.into_iter().map(|l| plain(l.as_array().expect("array"))).collect();
    (got, want)
}

/// Type, dimensions and bytes (layouts are all row-major here; only whether one is spelled
/// out differs between the executor and the interpreter).
type Plain = (PrimitiveType, Vec<i64>, Vec<u8>);

fn plain(a: &Array) -> Plain {
    (a.shape.ty, a.shape.dims.clone(), a.data.clone())
}

#[test]
fn replica_mode_with_a_permuted_assignment_matches_the_interpreter() {
    let c = client(6);
    let code = std::fs::read(FIXTURE).unwrap();
    let compiled = compile(&c, "hlo", &code, &options(4, &[5, 2, 0, 3], &[])).expect("compile");
    assert_eq!((compiled.num_replicas, compiled.num_partitions), (4, 1));
    // Replica r runs on the assignment's device r (the order Execute's argument lists use).
    assert_eq!(compiled.devices, vec![5, 2, 0, 3]);
    let (got, want) = run_both(&c, &compiled);
    assert_eq!(got, want);
    // The collectives mixed the replicas (not every output equals its own input's result).
    assert_ne!(got[0], got[2]);
    // Repeated calls of one executable give the same answer.
    for _ in 0..3 {
        assert_eq!(run_both(&c, &compiled).0, want);
    }
}

#[test]
fn compile_option_overrides_set_peerless_flags() {
    let c = client(4);
    let code = std::fs::read(FIXTURE).unwrap();
    for backend in ["fallback", "kernel", "auto"] {
        let opts = options(4, &[0, 1, 2, 3], &[("all_reduce_backend", backend), ("xla_cpu_enable_fast_math", "true")]);
        let compiled = compile(&c, "hlo", &code, &opts).unwrap_or_else(|e| panic!("{backend}: {e}"));
        let (got, want) = run_both(&c, &compiled);
        assert_eq!(got, want, "all_reduce_backend={backend}");
    }
    let e = compile(&c, "hlo", &code, &options(4, &[0, 1, 2, 3], &[("all_reduce_backend", "bogus")])).err().unwrap();
    assert!(e.message.contains("all_reduce_backend=bogus"), "{}", e.message);
    let e = compile(&c, "hlo", &code, &options(4, &[0, 1, 2, 3], &[("no_such_flag", "1")])).err().unwrap();
    assert!(e.message.contains("No such compile option: 'no_such_flag'"), "{}", e.message);
}

#[test]
fn execute_argument_errors() {
    let c = client(4);
    let code = std::fs::read(FIXTURE).unwrap();
    let compiled = compile(&c, "hlo", &code, &options(4, &[0, 1, 2, 3], &[])).expect("compile");
    let a = input(0);
    let bufs: Vec<Buffer> = (0..4).map(|d| buffer(&c, d, &a)).collect();
    // Three argument lists for four replicas.
    let three: Vec<Vec<&Buffer>> = bufs.iter().take(3).map(|b| vec![b]).collect();
    let e = compiled.execute(&three).err().unwrap();
    assert!(e.message.contains("3 argument lists"), "{}", e.message);
    // Replica 1's argument on device 2.
    let swapped: Vec<Vec<&Buffer>> = [0, 2, 1, 3].iter().map(|&d| vec![&bufs[d]]).collect();
    let e = compiled.execute(&swapped).err().unwrap();
    assert!(e.message.contains("lives on device 2"), "{}", e.message);
    // A device assignment naming a device the client lacks, or one device twice.
    let e = compile(&c, "hlo", &code, &options(4, &[0, 1, 2, 9], &[])).err().unwrap();
    assert!(e.message.contains("no device with id 9"), "{}", e.message);
    let e = compile(&c, "hlo", &code, &options(4, &[0, 1, 1, 3], &[])).err().unwrap();
    assert!(e.message.contains("repeats a device"), "{}", e.message);
}
