//! Concise tables for the terminal.

use std::fmt::Write;

use hlo::{Array, Literal, Module, PrimitiveType};
use runs::{Mode, RunConfig};

/// Formats seconds with a unit that keeps three significant digits.
pub fn duration(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.2} s")
    } else if secs >= 1e-3 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{:.1} µs", secs * 1e6)
    }
}

/// Renders rows as a left-aligned table with a header rule.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    out.push_str(&line(widths.iter().map(|&w| "-".repeat(w)).collect::<Vec<_>>().iter().map(String::as_str).collect()));
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// What a device is in `mode`: a replica or a partition.
pub fn device_word(mode: Mode) -> &'static str {
    match mode {
        Mode::Replica => "replica",
        Mode::Partition => "partition",
    }
}

/// `check`'s summary: the module and its entry signature.
pub fn summary(module: &Module) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "module {}: {} computations, {} instructions, replica_count={}, num_partitions={}",
        module.name,
        module.comps.len(),
        module.instrs.len(),
        module.config.replica_count.max(1),
        module.config.num_partitions.max(1)
    );
    for (i, shape) in module.entry_param_shapes().iter().enumerate() {
        let _ = writeln!(s, "  param {i}: {shape}");
    }
    let _ = writeln!(s, "  result: {}", module.entry_result_shape());
    s
}

/// `check`'s decision table: one line per collective with the pass's decision on `platform` and why.
pub fn decisions(decisions: &[emitter::xla_pass::PassDecision], cfg: &RunConfig, platform: &str) -> String {
    let mode = format!("{}s", device_word(cfg.mode));
    if decisions.is_empty() {
        return format!("collectives on {} {mode} ({platform}): none\n", cfg.num_devices);
    }
    let rows: Vec<Vec<String>> = decisions
        .iter()
        .map(|d| {
            vec![
                d.instr.clone(),
                d.op.clone(),
                d.dtype.clone(),
                d.bytes.to_string(),
                d.groups.clone(),
                d.implementation.clone(),
                d.reason.clone(),
            ]
        })
        .collect();
    format!(
        "collectives on {} {mode}, the pass inside XLA ({platform}):\n{}",
        cfg.num_devices,
        table(&["collective", "op", "dtype", "bytes/device", "groups", "implementation", "reason"], &rows)
    )
}

/// `run`'s output table: one row per device and result leaf.
pub fn outputs_table(cfg: &RunConfig, outputs: &[Literal]) -> String {
    let mode = device_word(cfg.mode);
    let mut rows = Vec::new();
    for (d, out) in outputs.iter().enumerate() {
        for (j, leaf) in out.leaves().into_iter().enumerate() {
            rows.push(vec![format!("o{j}"), format!("{mode} {d}"), leaf.shape.to_string(), preview(leaf, 6)]);
        }
    }
    table(&["output", "device", "shape", "values"], &rows)
}

/// The first `n` elements of an array, formatted for its element type.
pub fn preview(a: &Array, n: usize) -> String {
    let count = a.element_count();
    let shown: Vec<String> = (0..count.min(n)).map(|i| element(a, i)).collect();
    let more = if count > n { format!(", … ({count} elements)") } else { String::new() };
    format!("[{}{}]", shown.join(", "), more)
}

fn element(a: &Array, i: usize) -> String {
    let b = a.element_bytes(i);
    let le = |n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&b[..n]);
        u64::from_le_bytes(v)
    };
    match a.ty() {
        PrimitiveType::Pred => (b[0] != 0).to_string(),
        PrimitiveType::S8 => (b[0] as i8).to_string(),
        PrimitiveType::S16 => (le(2) as u16 as i16).to_string(),
        PrimitiveType::S32 => (le(4) as u32 as i32).to_string(),
        PrimitiveType::S64 => (le(8) as i64).to_string(),
        PrimitiveType::U8 | PrimitiveType::U16 | PrimitiveType::U32 | PrimitiveType::U64 => le(b.len()).to_string(),
        PrimitiveType::F16 => format!("{}", half::f16::from_bits(le(2) as u16)),
        PrimitiveType::Bf16 => format!("{}", half::bf16::from_bits(le(2) as u16)),
        PrimitiveType::F32 => format!("{:.6}", f32::from_bits(le(4) as u32)),
        PrimitiveType::F64 => format!("{:.6}", f64::from_bits(le(8))),
        other => format!("0x{:0w$x}/{other}", le(b.len().min(8)), w = b.len().min(8) * 2),
    }
}

#[cfg(test)]
#[path = "../tests/unit/report.rs"]
mod tests;
