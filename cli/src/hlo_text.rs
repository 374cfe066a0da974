//! HLO text for `run --backend xla`: XLA's PJRT plugins compile a binary `HloModuleProto`
//! (or StableHLO), not HLO text, and Peerless's hlo crate parses text but does not encode
//! protos. XLA's own text parser does both: jaxlib's `_hlo.hlo_module_from_text(...)
//! .as_serialized_hlo_module_proto()`, the call `hlo-tests/gen_goldens.py` makes. The Python
//! that runs it: `PEERLESS_PYTHON` when set, else the virtual environment XLA's plugin is
//! installed in (the JAX venv that `scripts/setup.sh` makes holds jaxlib beside
//! `lammps-jax-pjrt-cpu`), else `python3` on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

const CONVERT: &str = "import sys\n\
from jaxlib import _hlo\n\
text = open(sys.argv[1], encoding='utf-8').read()\n\
sys.stdout.buffer.write(_hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto())\n";

/// The Python interpreters to try, in order, each with where it came from.
fn pythons(plugin: &Path) -> Vec<(PathBuf, String)> {
    if let Some(p) = std::env::var_os("PEERLESS_PYTHON").filter(|p| !p.is_empty()) {
        return vec![(PathBuf::from(p), "PEERLESS_PYTHON".into())];
    }
    let mut out = Vec::new();
    if let Some(venv) = plugin.ancestors().skip(1).find(|d| d.join("pyvenv.cfg").is_file()) {
        let python = venv.join("bin/python");
        if python.is_file() {
            out.push((python, "the plugin's virtual environment".into()));
        }
    }
    out.push((PathBuf::from("python3"), "PATH".into()));
    out
}

/// The serialized `HloModuleProto` of the HLO text in `file`, parsed by XLA (jaxlib).
pub fn to_proto(file: &Path, plugin: &Path) -> Result<Vec<u8>, String> {
    let mut tried = Vec::new();
    for (python, from) in pythons(plugin) {
        match Command::new(&python).arg("-c").arg(CONVERT).arg(file).output() {
            Ok(o) if o.status.success() && !o.stdout.is_empty() => {
                log::info!("{}: HLO text to HloModuleProto with {} ({from})", file.display(), python.display());
                return Ok(o.stdout);
            }
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr);
                let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim();
                tried.push(format!("{} ({from}): {last}", python.display()));
            }
            Err(e) => tried.push(format!("{} ({from}): {e}", python.display())),
        }
    }
    Err(format!(
        "{}: XLA compiles a binary HloModuleProto, and turning HLO text into one takes XLA's HLO parser \
         from jaxlib, which no Python here has; tried {}. Install jaxlib into one of them \
         (scripts/setup.sh makes .venv/jax with it), or set PEERLESS_PYTHON to a Python that has it, \
         or pass a binary .pb (hlo-tests/goldens/<case>.pb), or run on the standalone runtime \
         (--backend host)",
        file.display(),
        tried.join("; ")
    ))
}
