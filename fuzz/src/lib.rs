//! One function per fuzz target, shared by the libFuzzer binaries (`fuzz/libfuzzer`, nightly) and the stable replay of
//! the saved corpora (`fuzz/tests/corpus.rs`). Each takes arbitrary bytes and must return without panicking, aborting,
//! hanging or allocating more than the input justifies. What each target parses and then runs: docs/RELIABILITY.md
//! ("Fuzzing").

use emitter::Flags;
use hlo::analysis::DeviceMode;

/// Every target by name, for the replay test and the fuzz binaries.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("hlo_text", hlo_text),
    ("hlo_proto", hlo_proto),
    ("compile_options", compile_options),
    ("npz", npz),
    ("flags", flags),
    ("xla_pass", xla_pass),
];

/// What a verified module goes through after parsing on its way into XLA (`peerless run`): encoded as an
/// HloModuleProto, then prepared on 1 and 2 devices in both modes (the device assignment written in, the pass,
/// partitions marked manual). No XLA plugin is loaded.
fn downstream(module: &hlo::Module) {
    let Ok(bytes) = hlo::encode_proto(module) else { return };
    for (n, mode) in [(1, DeviceMode::Replica), (2, DeviceMode::Replica), (2, DeviceMode::Partition)] {
        let ids: Vec<i64> = (0..n).collect();
        let _ = tools::xla_run::prepare(&bytes, mode, &ids, plugin::Platform::Cpu, &[]);
    }
}

/// HLO text (`hlo::parse_text`), then [`downstream`].
pub fn hlo_text(data: &[u8]) {
    if let Ok(src) = std::str::from_utf8(data)
        && let Ok(m) = hlo::parse_text("fuzz.hlo", src)
    {
        downstream(&m);
    }
}

/// A serialized `HloModuleProto` (`hlo::decode_proto`), then [`downstream`].
pub fn hlo_proto(data: &[u8]) {
    if let Ok(m) = hlo::decode_proto("fuzz.pb", data) {
        downstream(&m);
    }
}

/// `CompileOptionsProto` bytes as a PJRT client hands them to the wrapper's `PJRT_Client_Compile`: Peerless's options
/// split out on the wire (the rest is XLA's), and the flags they name applied to the pass's flags, as the compile does.
pub fn compile_options(data: &[u8]) {
    if let Ok(Some((flags, rest))) = plugin::wrap::split_compile_options(data) {
        assert!(rest.len() <= data.len(), "the options grew");
        let mut f = Flags::default();
        for flag in &flags {
            let _ = f.apply(flag);
        }
    }
}

/// npz archive bytes (`runs::io::read_npz_bytes`).
pub fn npz(data: &[u8]) {
    let _ = runs::io::read_npz_bytes("fuzz.npz", data);
}

/// A flag string: `Flags::parse` of the whole, and `Flags::apply` of each word.
pub fn flags(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = Flags::parse(s);
        let mut f = Flags::default();
        for word in s.split_whitespace() {
            let _ = f.apply(word);
        }
    }
}

/// A serialized `HloModuleProto` as XLA hands it to the Peerless pass (`emitter::xla_pass::run`, the body of the
/// plugin's `PeerlessXlaPass`, called here without its panic guard so a panic is a finding), then the pass again on the
/// module it rewrote.
pub fn xla_pass(data: &[u8]) {
    let cfg = emitter::xla_pass::PassConfig { instance_base: Some(1), ..Default::default() };
    if let Ok(emitter::xla_pass::PassOutcome { module: Some(m), .. }) = emitter::xla_pass::run(data, &cfg) {
        let _ = emitter::xla_pass::run(&m, &cfg);
    }
}
