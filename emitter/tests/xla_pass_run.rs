//! `emitter::xla_pass::run` on hand-set configs: process topologies, lazy peer tables, the
//! staging budget, call ordering on XLA:CPU, the decisions each call carries, and the rewrite
//! of an async tuple start (the golden filetests are in `xla_pass.rs`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use emitter::xla_pass::{PassConfig, PassDecision, PassError, PassOutcome, Peers, Topology, has_collectives, run};
use emitter::{Capabilities, PeerAccessTable, xla_pass};
use hlo::Opcode;
use hlo::proto::xla;
use hlo::wire::{
    WireType, fields, hlo_computation as computation, hlo_instruction as instruction, hlo_module, ints, put_bytes,
    put_varint,
};
use prost::Message;

/// The instructions' ids and names of a whole module.
fn ids_and_names(module: &[u8]) -> (BTreeSet<i64>, BTreeSet<String>) {
    let (mut ids, mut names) = (BTreeSet::new(), BTreeSet::new());
    for c in fields(module)
        .unwrap()
        .iter()
        .filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited)
    {
        for i in fields(c.payload).unwrap().iter().filter(|i| i.number == computation::INSTRUCTIONS) {
            for x in fields(i.payload).unwrap() {
                match x.number {
                    instruction::ID => ids.extend(ints(&x).unwrap()),
                    instruction::NAME => drop(names.insert(String::from_utf8_lossy(x.payload).into_owned())),
                    _ => {}
                }
            }
        }
    }
    (ids, names)
}

#[test]
fn wire_walker_rejects_truncated_input() {
    // hlo::wire's tests cover the walker; here its errors reach the pass's.
    let e = has_collectives(&[0x0a, 0x05, 1, 2]).unwrap_err();
    assert!(matches!(&e, PassError::Wire(m) if m.contains("runs past the end")), "{e}");
    assert!(matches!(has_collectives(&[0x0b]), Err(PassError::Wire(_))));
    assert!(has_collectives(&[]).is_ok_and(|x| !x));
}

fn two_processes(hosts: &str, job: &str) -> Topology {
    let devices: Vec<String> = (0..8).map(|d| format!("{d}:{}", d / 4)).collect();
    Topology::parse(&format!("this=1;job={job};devices={};hosts={hosts}", devices.join(","))).unwrap()
}

fn decide(pb: &[u8], topology: Topology, cross_process: bool) -> (PassDecision, Option<String>) {
    let cfg = PassConfig {
        topology: Some(topology),
        caps: Capabilities {
            variadic: true,
            cross_process,
            in_order: false,
            fused_norm: true,
            fused_norm_auto: true,
            async_queue: false,
            copy_engines: false,
        },
        instance_base: Some(1),
        ..PassConfig::default()
    };
    let out = run(pb, &cfg).unwrap();
    let text = out.module.map(|m| String::from_utf8_lossy(&m).into_owned());
    (out.decisions.into_iter().next().unwrap(), text)
}

#[test]
fn topology_parses_and_rejects() {
    let t = two_processes("0:0,1:0", "00ff00ff");
    assert_eq!(t.process_of.get(&5), Some(&1));
    assert_eq!(t.local_devices().unwrap().into_iter().collect::<Vec<_>>(), [4, 5, 6, 7]);
    assert_eq!(t.job.as_deref(), Some("00ff00ff"));
    assert!(Topology::parse("job=xyz").unwrap_err().contains("hex"));
    assert!(Topology::parse("devices=0:0").unwrap_err().contains("no host"));
    assert!(Topology::parse("devices=0-0;hosts=0:0").unwrap_err().contains("not A:B"));
    assert!(Topology::parse("colour=red").unwrap_err().contains("unknown topology key"));
    assert_eq!(Topology::parse("job=").unwrap().job, None);
    let o = Topology::parse("this=1;devices=0:0,1:1;hosts=0:0,1:0;ordinals=1:0").unwrap();
    assert_eq!(o.ordinals.into_iter().collect::<Vec<_>>(), [(1, 0)]);
}

#[test]
fn groups_across_processes_are_decided_by_host() {
    let all = include_bytes!("xla_pass/psum_mesh2x4_both.pb");
    let halves = include_bytes!("xla_pass/psum_mesh2x4_axis_b.pb");
    // One host: the 8-device group meets through shared memory, named by the job.
    let (d, m) = decide(all, two_processes("0:0,1:0", "abcdef0123"), true);
    assert!(d.kernel, "{d}");
    let m = m.unwrap();
    assert!(m.contains("processes = array<i64: 0, 0, 0, 0, 1, 1, 1, 1>"), "{m}");
    // Nothing of the run in the module: another job's token gives the same bytes, so a
    // persistent compilation cache may hand the executable to any job of this layout.
    assert!(!m.contains("abcdef0123") && !m.contains("job"), "{m}");
    let (_, other) = decide(all, two_processes("0:0,1:0", "9999888877776666"), true);
    assert_eq!(other.unwrap(), m);
    // Two hosts: XLA's collective.
    let (d, _) = decide(all, two_processes("0:0,1:1", "abcdef0123"), true);
    assert!(!d.kernel && d.reason.contains("spans hosts"), "{d}");
    // A platform whose handlers stay in one process, or no job token: XLA's.
    let (d, _) = decide(all, two_processes("0:0,1:0", "abcdef0123"), false);
    assert!(!d.kernel && d.reason.contains("do not reach across processes"), "{d}");
    let (d, _) = decide(all, Topology { job: None, ..two_processes("0:0,1:0", "abcdef0123") }, true);
    assert!(!d.kernel && d.reason.contains("no job token"), "{d}");
    // Groups inside each process: as in one process (no processes attribute), on any host layout.
    let (d, m) = decide(halves, two_processes("0:0,1:1", "abcdef0123"), false);
    assert!(d.kernel, "{d}");
    assert!(!m.unwrap().contains("processes ="));
}

#[test]
fn copy_engine_calls_cross_processes_too() {
    // The flag words of a call across processes are a shared segment each process registers
    // with its GPUs: the copy-engine form runs there as within one process.
    let all = include_bytes!("xla_pass/psum_mesh2x4_both.pb");
    let mut cfg = PassConfig {
        topology: Some(two_processes("0:0,1:0", "abcdef0123")),
        caps: Capabilities { variadic: true, cross_process: true, copy_engines: true, ..Capabilities::default() },
        instance_base: Some(1),
        ..PassConfig::default()
    };
    cfg.flags.apply("--copy_engines=0").unwrap();
    let d = run(all, &cfg).unwrap().decisions.into_iter().next().unwrap();
    assert!(d.kernel && d.implementation.contains("copy-engine all-reduce"), "{d}");
    assert!(d.reason.contains("across processes of one host"), "{d}");
    cfg.topology = None;
    let d = run(all, &cfg).unwrap().decisions.into_iter().next().unwrap();
    assert!(d.kernel && d.implementation.contains("copy-engine all-reduce"), "{d}");
}

#[test]
fn calls_carry_their_decisions_and_the_first_the_fallbacks() {
    // A permute ring and a psum; forcing the permute to XLA leaves the psum the only call.
    let pb = include_bytes!("xla_pass/ppermute_then_psum.pb");
    let mut cfg = PassConfig { instance_base: Some(1), ..PassConfig::default() };
    cfg.flags.apply("--collective_permute_backend=fallback").unwrap();
    let out = run(pb, &cfg).unwrap();
    assert_eq!(out.instances, [1]);
    let kernel = out.decisions.iter().find(|d| d.kernel).unwrap();
    let fallback = out.decisions.iter().find(|d| !d.kernel).unwrap();
    let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
    let escaped = |line: String| line.replace('\t', "\\09").replace('\n', "\\0A");
    assert!(m.contains(&escaped(kernel.report_line() + &fallback.report_line())), "{m}");
    // Both kernels: each call carries its own line, the first also (no) fallbacks.
    let out = run(pb, &PassConfig { instance_base: Some(7), ..PassConfig::default() }).unwrap();
    assert_eq!(out.instances, [7, 8]);
    let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
    for d in &out.decisions {
        assert!(m.contains(&format!("decisions = \"{}\"", escaped(d.report_line()))), "{m}");
    }
}

#[test]
fn the_peer_table_is_made_only_when_a_collective_needs_it() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    let made = Arc::new(AtomicUsize::new(0));
    let m = made.clone();
    let cfg = PassConfig {
        peers: Peers::Lazy(Arc::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
            Arc::new(PeerAccessTable::full(8, "test table"))
        })),
        instance_base: Some(1),
        ..PassConfig::default()
    };
    // Groups of one and the dtype guard decide without peer access: no GPU is opened.
    for pb in [
        &include_bytes!("xla_pass/psum_one_device.pb")[..],
        include_bytes!("xla_pass/psum_axis_of_one.pb"),
        include_bytes!("xla_pass/all_gather_c64.pb"),
        include_bytes!("xla_pass/no_collective.pb"),
    ] {
        let out = run(pb, &cfg).unwrap();
        assert!(out.decisions.iter().all(|d| !d.kernel), "{:?}", out.decisions);
    }
    // A partitioner-made call left to XLA by its size (rule 10) is decided before peer
    // access (rule 13, the one rule that opens GPUs).
    let mut big = cfg.clone();
    big.flags.apply("--xla_async_above_bytes=1024").unwrap();
    let out = run(include_bytes!("xla_pass/mlp_train_step.pb"), &big).unwrap();
    assert!(out.decisions.iter().all(|d| !d.kernel && d.reason.contains("partitioner-made")), "{:?}", out.decisions);
    assert_eq!(made.load(Ordering::SeqCst), 0);
    // Two collectives that take kernels: the table is made once per run.
    let out = run(include_bytes!("xla_pass/ppermute_then_psum.pb"), &cfg).unwrap();
    assert_eq!(out.decisions.iter().filter(|d| d.kernel).count(), 2);
    assert_eq!(made.load(Ordering::SeqCst), 1);
}

#[test]
fn a_known_peer_table_is_a_plain_value_of_the_configuration() {
    use std::sync::Arc;
    // The table the runtime knows (its own, or the probe it kept on disk) decides as a probe would, and nothing is asked
    // of a device: the configuration holds no closure.
    let with = |table: PeerAccessTable| {
        let cfg = PassConfig { peers: Peers::Known(Arc::new(table)), instance_base: Some(1), ..PassConfig::default() };
        run(include_bytes!("xla_pass/ppermute_then_psum.pb"), &cfg).unwrap()
    };
    let linked = with(PeerAccessTable::full(8, "kept probe"));
    assert_eq!(linked.decisions.iter().filter(|d| d.kernel).count(), 2, "{:?}", linked.decisions);
    let unlinked = with(PeerAccessTable::from_fn(8, "kept probe", |_, _| false));
    assert!(
        unlinked
            .decisions
            .iter()
            .all(|d| !d.kernel && d.reason.contains("no peer access") && d.reason.contains("kept probe")),
        "{:?}",
        unlinked.decisions
    );
    assert!(unlinked.module.is_none());
}

#[test]
fn staging_beyond_a_quarter_of_free_device_memory_goes_back_to_xla() {
    // Slots of 512 (psum_invariant.18), 512 (the pmax chain) and 1024 bytes (two psums
    // and an all-gather): 2048 bytes of GPU staging in all.
    let pb = include_bytes!("xla_pass/psum_chains_independent.pb");
    let with = |free: Option<u64>| {
        let cfg = PassConfig {
            instance_base: Some(1),
            device_memory: free,
            // A GPU: calls run in stream order, so independent chains keep their kernels.
            caps: Capabilities { variadic: true, in_order: true, ..Capabilities::default() },
            ..PassConfig::default()
        };
        run(pb, &cfg).unwrap()
    };
    let kernels = |out: &PassOutcome| out.decisions.iter().filter(|d| d.kernel).count();
    assert_eq!(kernels(&with(None)), 6, "unknown free memory: no budget");
    assert_eq!(kernels(&with(Some(4 * 2048))), 6, "exactly within a quarter");
    // A quarter of 6144 is 1536: the largest slot (1024 bytes, three calls) goes back.
    let out = with(Some(6144));
    let back: Vec<&str> = out.decisions.iter().filter(|d| !d.kernel).map(|d| d.instr.as_str()).collect();
    assert_eq!(back, ["psum_invariant.21", "psum_invariant.22", "all_gather.3"], "{:?}", out.decisions);
    let d = out.decisions.iter().find(|d| d.instr == "all_gather.3").unwrap();
    assert!(d.reason.starts_with("staging budget:") && d.reason.contains("0.0 MiB free"), "{}", d.reason);
    let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
    assert!(!m.contains("name = \"all_gather.3\"") && m.contains("name = \"pmax.15\""), "{m}");
    // Nothing free: every slot goes back, and the module is left as it was.
    let out = with(Some(0));
    assert_eq!(kernels(&out), 0);
    assert!(out.module.is_none());
}

#[test]
fn on_xla_cpu_unordered_calls_go_back() {
    // XLA:CPU may run a device's independent thunks at once, on a pool as small as the
    // machine's cores (a deadlock when devices wait in different calls). The rewrite chains
    // every call after the first of its computation behind the previous one.
    let cpu = PassConfig { instance_base: Some(1), ..PassConfig::default() };
    let gpu =
        PassConfig { caps: Capabilities { variadic: true, in_order: true, ..Capabilities::default() }, ..cpu.clone() };
    // (tests/xla_pass/independent_all_reduces{,_gpu}.expected show a chain.) A chain of
    // data dependencies needs no ordering operand (none keeps a result alive longer).
    let pb = include_bytes!("xla_pass/psum_chain.pb");
    let out = run(pb, &cpu).unwrap();
    assert!(out.decisions.iter().all(|d| d.kernel), "{:?}", out.decisions);
    let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
    assert!(!m.contains("order_operands"), "{m}");
    // A loop holding a psum beside two independent chains: nothing orders the loop with the
    // chains, so its call goes back, and with it, one after the other, the calls unordered
    // with what went back (the chains stay whole on a GPU).
    let pb = include_bytes!("xla_pass/psum_chains_independent.pb");
    let out = run(pb, &cpu).unwrap();
    let loop_call = out.decisions.iter().find(|d| d.instr == "psum_invariant.18").unwrap();
    assert!(!loop_call.kernel && loop_call.reason.contains("which runs it)"), "{}", loop_call.reason);
    for d in out.decisions.iter().filter(|d| !d.kernel) {
        assert!(d.reason.contains("at the same time as") && d.reason.contains("(was: "), "{}", d.reason);
    }
    assert!(run(pb, &gpu).unwrap().decisions.iter().all(|d| d.kernel));
}

/// `text` encoded by the hlo crate, with an N×1 device assignment.
fn replicas(text: &str, n: i64) -> Vec<u8> {
    let m = hlo::parse_text("t.hlo", text).unwrap();
    let mut bytes = hlo::encode_proto(&m).unwrap();
    let da = xla::DeviceAssignmentProto {
        replica_count: n as i32,
        computation_count: 1,
        computation_devices: vec![xla::device_assignment_proto::ComputationDevice {
            replica_device_ids: (0..n).collect(),
        }],
    };
    put_bytes(&mut bytes, 15, &da.encode_to_vec());
    bytes
}

#[test]
fn an_async_tuple_start_becomes_a_call_and_a_tuple_with_fresh_id_and_name() {
    // `st.peerless` is taken, and the start's other users read both tuple elements.
    let text = "HloModule m\n\nENTRY main {\n  x = f32[4]{0} parameter(0)\n  st.peerless = f32[4]{0} negate(x)\n  \
                st = (f32[4]{0}, f32[4]{0}) collective-permute-start(st.peerless), source_target_pairs={{0,1},{1,0}}\n  \
                a = f32[4]{0} get-tuple-element(st), index=0\n  dn = f32[4]{0} collective-permute-done(st)\n  \
                ROOT t = (f32[4]{0}, f32[4]{0}) tuple(dn, a)\n}\n";
    let bytes = replicas(text, 2);
    let out = run(&bytes, &PassConfig { instance_base: Some(1), ..PassConfig::default() }).unwrap();
    assert!(out.decisions[0].kernel, "{}", out.decisions[0]);
    let rewritten = out.module.unwrap();
    // Every id of the module is distinct (XLA's importer requires it).
    let (ids, names) = ids_and_names(&rewritten);
    let count = fields(&rewritten)
        .unwrap()
        .iter()
        .filter(|c| c.number == hlo_module::COMPUTATIONS)
        .map(|c| fields(c.payload).unwrap().iter().filter(|i| i.number == computation::INSTRUCTIONS).count())
        .sum::<usize>();
    assert_eq!((ids.len(), names.len()), (count, count));
    let m = hlo::decode_proto("out", &rewritten).unwrap();
    let by_name = |n: &str| m.instrs.values().find(|i| i.name == n).unwrap();
    let call = by_name("st.peerless.1");
    assert_eq!(call.opcode, Opcode::CustomCall);
    assert_eq!(call.attrs.custom_call_target.as_deref(), Some("peerless.collective_permute"));
    assert_eq!(m.instrs[call.operands[0]].name, "st.peerless");
    let st = by_name("st");
    assert_eq!(st.opcode, Opcode::Tuple);
    let operands: Vec<&str> = st.operands.iter().map(|&o| m.instrs[o].name.as_str()).collect();
    assert_eq!(operands, ["st.peerless", "st.peerless.1"]);
    let dn = by_name("dn");
    assert_eq!((dn.opcode, dn.attrs.tuple_index), (Opcode::GetTupleElement, Some(1)));
    assert_eq!(by_name("a").attrs.tuple_index, Some(0));
    // The pass's output has no collective left: a second run changes nothing.
    assert!(run(&rewritten, &PassConfig::default()).unwrap().module.is_none());
}

#[test]
fn shared_instances_agree_between_processes() {
    let pb = include_bytes!("xla_pass/psum_f32.pb");
    let fp = xla_pass::fingerprint(pb).unwrap();
    // The same module with another per-process id has the same fingerprint.
    let mut other = Vec::new();
    put_varint(&mut other, hlo_module::ID, 12345);
    for f in fields(pb).unwrap().iter().filter(|f| f.number != hlo_module::ID) {
        other.extend_from_slice(f.raw);
    }
    assert_eq!(xla_pass::fingerprint(&other).unwrap(), fp);
    let a = xla_pass::shared_instance(fp, "all-reduce.1");
    assert_eq!(a, xla_pass::shared_instance(fp, "all-reduce.1"));
    assert_ne!(a, xla_pass::shared_instance(fp, "all-reduce.2"));
    assert_ne!(a, xla_pass::shared_instance(fp ^ 1, "all-reduce.1"));
    assert!(a <= i64::MAX as u64);
}

#[test]
fn instance_ids_are_distinct_and_positive() {
    let a = xla_pass::next_instance();
    let b = xla_pass::next_instance();
    assert_ne!(a, b);
    assert!(a <= i64::MAX as u64 && b <= i64::MAX as u64);
}

/// `text` (2 replicas) with its host program shape saying the user's layout `{0,1}` for the
/// parameter and the result, as XLA:GPU hands a module over before layout assignment (the
/// instructions still row-major).
fn user_layout_module(text: &str) -> Vec<u8> {
    let mut m = xla::HloModuleProto::decode(&replicas(text, 2)[..]).unwrap();
    let host = m.host_program_shape.as_mut().unwrap();
    for s in host.parameters.iter_mut().chain(host.result.as_mut()) {
        s.layout = Some(Box::new(xla::LayoutProto { minor_to_major: vec![0, 1], ..Default::default() }));
    }
    m.encode_to_vec()
}

fn instr<'a>(m: &'a xla::HloModuleProto, name: &str) -> &'a xla::HloInstructionProto {
    m.computations.iter().flat_map(|c| &c.instructions).find(|i| i.name == name).unwrap()
}

fn minor_to_major(s: &Option<xla::ShapeProto>) -> Vec<i64> {
    s.as_ref().and_then(|s| s.layout.as_ref()).map(|l| l.minor_to_major.clone()).unwrap_or_default()
}

const ADD: &str = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n}\n\n";

#[test]
fn a_rewritten_module_keeps_the_users_entry_layouts() {
    // Issue 45: XLA takes a changed module's entry layout from its entry's shapes.
    let text = format!(
        "HloModule m\n\n{ADD}ENTRY main {{\n  x = f32[4,2]{{1,0}} parameter(0)\n  \
         ar = f32[4,2]{{1,0}} all-reduce(x), replica_groups={{{{0,1}}}}, to_apply=add\n  \
         ROOT n = f32[4,2]{{1,0}} negate(ar)\n}}\n"
    );
    let out = run(&user_layout_module(&text), &PassConfig { instance_base: Some(1), ..PassConfig::default() }).unwrap();
    assert!(out.decisions[0].kernel, "{}", out.decisions[0]);
    let m = xla::HloModuleProto::decode(&out.module.unwrap()[..]).unwrap();
    assert_eq!(minor_to_major(&instr(&m, "x").shape), [0, 1]);
    assert_eq!(minor_to_major(&instr(&m, "n").shape), [0, 1]);
    // The call stays row-major (what its handler is told); XLA copies the parameter for it.
    let call = instr(&m, "ar");
    assert_eq!(call.opcode, "custom-call");
    assert_eq!(minor_to_major(&call.shape), [1, 0]);
    assert_eq!(minor_to_major(&Some(call.operand_shapes_with_layout[0].clone())), [1, 0]);
}

#[test]
fn a_peerless_call_at_the_root_keeps_its_layout_behind_a_copy_in_the_users() {
    let text = format!(
        "HloModule m\n\n{ADD}ENTRY main {{\n  x = f32[4,2]{{1,0}} parameter(0)\n  \
         ROOT ar = f32[4,2]{{1,0}} all-reduce(x), replica_groups={{{{0,1}}}}, to_apply=add\n}}\n"
    );
    let out = run(&user_layout_module(&text), &PassConfig { instance_base: Some(1), ..PassConfig::default() }).unwrap();
    let bytes = out.module.unwrap();
    let m = xla::HloModuleProto::decode(&bytes[..]).unwrap();
    let entry = m.computations.iter().find(|c| c.name == m.entry_computation_name).unwrap();
    let root = entry.instructions.iter().find(|i| i.id == entry.root_id).unwrap();
    assert_eq!((root.opcode.as_str(), root.name.as_str()), ("copy", "ar.entry_layout"));
    assert_eq!(minor_to_major(&root.shape), [0, 1]);
    let call = instr(&m, "ar");
    assert_eq!((call.opcode.as_str(), minor_to_major(&call.shape)), ("custom-call", vec![1, 0]));
    assert_eq!(root.operand_ids, [call.id]);
    // Ids and names stay distinct, and the module decodes and verifies.
    let (ids, names) = ids_and_names(&bytes);
    let count: usize = m.computations.iter().map(|c| c.instructions.len()).sum();
    assert_eq!((ids.len(), names.len()), (count, count));
    hlo::decode_proto("out", &bytes).unwrap();
}

#[test]
fn entry_layouts_the_module_already_has_change_nothing() {
    // Default layouts (JAX's default) and a layout left to XLA (`AUTO`: none in the host
    // program shape) leave the entry's shapes as they are.
    let text = format!(
        "HloModule m\n\n{ADD}ENTRY main {{\n  x = f32[4,2]{{1,0}} parameter(0)\n  \
         ROOT ar = f32[4,2]{{1,0}} all-reduce(x), replica_groups={{{{0,1}}}}, to_apply=add\n}}\n"
    );
    let mut auto = xla::HloModuleProto::decode(&replicas(&text, 2)[..]).unwrap();
    auto.host_program_shape.as_mut().unwrap().parameters[0].layout = None;
    for bytes in [replicas(&text, 2), auto.encode_to_vec()] {
        let out = run(&bytes, &PassConfig { instance_base: Some(1), ..PassConfig::default() }).unwrap();
        let m = xla::HloModuleProto::decode(&out.module.unwrap()[..]).unwrap();
        assert_eq!(m.computations.iter().map(|c| c.instructions.len()).sum::<usize>(), 2 + 3);
        assert_eq!(minor_to_major(&instr(&m, "x").shape), [1, 0]);
    }
}

#[test]
fn the_pass_walks_and_decodes_a_module_once() {
    // Fusion off (a GPU's default): the slim copy is decoded; on (XLA:CPU's): the whole module,
    // which the matcher reads. Either way one walk of the bytes (the index every read and edit
    // uses) and one decode per run of a module it rewrites, and no decode without a collective.
    let pb = include_bytes!("xla_pass/ppermute_then_psum.pb");
    let no_fusion = {
        let mut c = PassConfig { instance_base: Some(1), ..PassConfig::default() };
        c.flags.apply("--fuse_norm=false").unwrap();
        c
    };
    let counts = || (hlo::wire::walks_on_this_thread(), hlo::proto::decodes_on_this_thread());
    for cfg in [&no_fusion, &PassConfig { instance_base: Some(1), ..PassConfig::default() }] {
        let (walks, decodes) = counts();
        let out = run(pb, cfg).unwrap();
        assert_eq!(out.decisions.iter().filter(|d| d.kernel).count(), 2);
        assert!(out.module.is_some());
        assert_eq!(counts(), (walks + 1, decodes + 1), "{:?}", cfg.flags.fuse_norm);
    }
    let (walks, decodes) = counts();
    run(include_bytes!("xla_pass/no_collective.pb"), &no_fusion).unwrap();
    run(include_bytes!("xla_pass/no_collective.pb"), &PassConfig::default()).unwrap();
    assert_eq!(counts(), (walks + 2, decodes));
}

#[test]
fn the_tuning_profile_is_the_handed_over_device_kinds() {
    use std::sync::Arc;

    use emitter::tuning::{ProfileSource, TuningConfig};
    // A 1 KiB f32 all-reduce over 4 GPUs (a fake peer table: every pair linked).
    let text = format!(
        "HloModule m\n\n{ADD}ENTRY main {{\n  x = f32[256]{{0}} parameter(0)\n  \
         ROOT ar = f32[256]{{0}} all-reduce(x), replica_groups={{{{0,1,2,3}}}}, to_apply=add\n}}\n"
    );
    let pb = replicas(&text, 4);
    // The kind is a plain value in the configuration, handed over by whoever holds XLA's
    // devices: resolving the tuning asks no device for it.
    let reason = |kind: &str| {
        let cfg = PassConfig {
            peers: Peers::Lazy(Arc::new(|| Arc::new(PeerAccessTable::full(4, "test GPUs")))),
            caps: Capabilities { variadic: true, in_order: true, ..Capabilities::default() },
            instance_base: Some(1),
            tuning: TuningConfig {
                source: ProfileSource::Default,
                platform: "cuda".into(),
                device_kind: Some(kind.into()),
                explicit_thresholds: false,
            },
            ..PassConfig::default()
        };
        let out = run(&pb, &cfg).unwrap();
        assert!(out.decisions.len() == 1 && out.decisions[0].kernel, "{:?}", out.decisions);
        out.decisions[0].reason.clone()
    };
    // Hopper's profile (the shipped one, unless this machine's cache holds one of that kind).
    let h200 = reason("NVIDIA H200");
    assert!(h200.contains("; profile ") && h200.ends_with("-> one-shot"), "{h200}");
    // Another kind: never a Hopper profile; the thresholds (no profile of that kind here).
    let a100 = reason("NVIDIA A100-SXM4-80GB");
    assert!(!a100.contains("cuda-hopper-nvlink"), "{a100}");
    assert!(a100.starts_with("1024 bytes <= one_shot_max_bytes="), "{a100}");
}
