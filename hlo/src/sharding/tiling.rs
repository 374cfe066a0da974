//! [`Tiling`], a sharding reduced to what per-device shapes need: how many tiles each dimension has. Built from HLO
//! shardings (`sharding={devices=[..]..}`) or from Shardy's string attributes (`#sdy.sharding<@mesh, [{"x"}, {}]>` with
//! the module's `xla.sdy.meshes`).
//!
//! The parsers return a bare reason (`String`); [`super::param_shapes`] turns it into an [`crate::Error`] about the
//! instruction that carries the attribute.

use crate::{ArrayShape, Module, Sharding};

/// A tiled layout of an array over devices. Uneven dimensions are padded: every shard has `ceil(dim / count)` elements
/// along a dimension, as XLA's partitioner lays them out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// Tiles per array dimension.
    pub counts: Vec<i64>,
}

impl Tiling {
    /// True when no dimension is split (the value is replicated).
    pub fn is_trivial(&self) -> bool {
        self.counts.iter().all(|&c| c == 1)
    }

    /// The shard shape of a global array shape.
    pub fn shard_shape(&self, global: &ArrayShape) -> ArrayShape {
        let dims = global
            .dims
            .iter()
            .zip(self.counts.iter().chain(std::iter::repeat(&1)))
            // Saturating: a dimension near i64::MAX must not panic (this crate never does).
            .map(|(&g, &c)| if c <= 1 { g } else { g.saturating_add(c - 1) / c })
            .collect();
        ArrayShape::new(global.ty, dims)
    }
}

/// Converts an HLO sharding for an array of `rank` dimensions on `n` devices. `Ok(None)`: replicated, manual, maximal
/// or unknown (the full value on every device).
pub(super) fn from_hlo(s: &Sharding, rank: usize, n: usize) -> Result<Option<Tiling>, String> {
    let Sharding::Tiled { tile_dims, devices, last_tile_dim_replicate, last_tile_dims } = s else {
        return Ok(None);
    };
    if last_tile_dims.iter().any(|k| k.trim() == "unreduced") {
        return Err("a value with unreduced axes (partial sums to be reduced by XLA's SPMD partitioner) \
                    is not supported"
            .into());
    }
    let extra = *last_tile_dim_replicate as usize + last_tile_dims.len();
    if tile_dims.len() != rank + extra {
        return Err(format!("sharding has {} tile dimensions, array has rank {rank}", tile_dims.len()));
    }
    if tile_dims.iter().any(|&t| t < 1) {
        return Err("sharding has a tile dimension < 1".into());
    }
    let total = tile_dims.iter().try_fold(1i64, |p, &t| p.checked_mul(t)).ok_or("sharding has too many tiles")?;
    if total as usize != devices.len() {
        return Err(format!("sharding lists {} devices for {total} tiles", devices.len()));
    }
    if devices.len() != n {
        return Err(format!("sharding spans {} devices, running on {n}", devices.len()));
    }
    Ok(Some(Tiling { counts: tile_dims[..rank].to_vec() }))
}

/// A Shardy mesh: named axes with sizes (which device sits where does not change a shard's shape).
type Mesh = Vec<(String, i64)>;

fn strip(s: &str) -> String {
    s.replace('\\', "")
}

/// Finds the bracketed text starting at `open` (which must be `[`, `{` or `<`), returning the inside and the index
/// after the closing bracket.
fn bracketed(s: &str, open: usize) -> Option<(&str, usize)> {
    let b = s.as_bytes();
    let (o, c) = match b.get(open)? {
        b'[' => (b'[', b']'),
        b'{' => (b'{', b'}'),
        b'<' => (b'<', b'>'),
        _ => return None,
    };
    let mut depth = 0;
    for (i, &ch) in b.iter().enumerate().skip(open) {
        if ch == o {
            depth += 1;
        } else if ch == c {
            depth -= 1;
            if depth == 0 {
                return Some((&s[open + 1..i], i + 1));
            }
        }
    }
    None
}

fn quoted(s: &str) -> Vec<String> {
    s.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

fn parse_mesh(body: &str) -> Result<Mesh, String> {
    // body: `["a"=2, "b"=4], device_ids=[...]` (the inside of `#sdy.mesh<...>`).
    let start = body.find('[').ok_or("mesh without axes")?;
    let (axes_s, _) = bracketed(body, start).ok_or("unbalanced mesh")?;
    let axis = |part: &str| {
        let (name, size) = part.split_once('=').ok_or(format!("bad mesh axis '{part}'"))?;
        let name = quoted(name).into_iter().next().ok_or(format!("bad mesh axis '{part}'"))?;
        Ok((name, size.trim().parse().map_err(|_| format!("bad mesh axis size '{part}'"))?))
    };
    axes_s.split(',').filter(|p| !p.trim().is_empty()).map(axis).collect()
}

fn find_mesh(module: &Module, name: &str) -> Result<Mesh, String> {
    let meshes = module
        .config
        .frontend_attributes
        .get("xla.sdy.meshes")
        .map(|s| strip(s))
        .ok_or("module has no xla.sdy.meshes")?;
    let mut pos = 0;
    while let Some(p) = meshes[pos..].find("#sdy.mesh<") {
        let at = pos + p;
        let head = meshes[..at].trim_end().trim_end_matches('=').trim_end();
        let mesh_name = head.rsplit(|c: char| c == '{' || c == ',' || c.is_whitespace()).next().unwrap_or("");
        let open = at + "#sdy.mesh".len();
        let (body, after) = bracketed(&meshes, open).ok_or("unbalanced xla.sdy.meshes")?;
        if mesh_name == name {
            return parse_mesh(body);
        }
        pos = after;
    }
    Err(format!("mesh @{name} not found in xla.sdy.meshes"))
}

/// Parses every `<@mesh, [dims]>` of a Shardy sharding attribute (`#sdy.sharding<..>` or
/// `#sdy.sharding_per_value<[..]>`): per value, the mesh name and the axes of each dimension.
fn parse_values(s: &str) -> Result<Vec<(String, Vec<Vec<String>>)>, String> {
    let s = strip(s);
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(p) = s[pos..].find('@') {
        let at = pos + p + 1;
        let end = s[at..].find([',', '>', ' ']).map(|e| at + e).ok_or("bad sharding")?;
        let name = s[at..end].to_string();
        let open = s[end..].find('[').map(|o| end + o).ok_or("sharding without dimensions")?;
        let (dims_s, after) = bracketed(&s, open).ok_or("unbalanced sharding")?;
        let mut dims = Vec::new();
        let mut i = 0;
        while let Some(o) = dims_s[i..].find('{') {
            let (inner, next) = bracketed(dims_s, i + o).ok_or("unbalanced dimension sharding")?;
            if inner.contains(':') {
                return Err(format!("sub-axis dimension sharding '{{{inner}}}' is not supported"));
            }
            dims.push(quoted(inner));
            i = next;
        }
        // `unreduced={"y"}`: every device holds a partial sum over those axes, to be reduced when the value is
        // resharded: that reduction is inserted by XLA's SPMD partitioner, and reading the value as replicated would
        // give wrong sums. (`reduced` axes, whose values are already equal across the axis, are harmless.)
        let rest = &s[after..];
        let tail = &rest[..rest.find('>').unwrap_or(rest.len())];
        if let Some(u) = tail.find("unreduced") {
            let axes = tail[u..].find('{').and_then(|o| bracketed(&tail[u..], o)).map_or("", |(inner, _)| inner);
            return Err(format!(
                "a value with unreduced axes {{{axes}}} (partial sums to be reduced by XLA's SPMD partitioner) \
                 is not supported"
            ));
        }
        out.push((name, dims));
        pos = after;
    }
    Ok(out)
}

fn tiling_from_mesh(mesh: &Mesh, dims: &[Vec<String>], n: usize) -> Result<Tiling, String> {
    // Checked arithmetic: axis sizes come straight from the attribute text.
    let overflow = || "mesh axis sizes overflow".to_string();
    let total = mesh.iter().try_fold(1i64, |p, a| p.checked_mul(a.1)).ok_or_else(overflow)?;
    if total as usize != n {
        return Err(format!("mesh has {total} devices, running on {n}"));
    }
    let axis = |name: &str| mesh.iter().position(|a| a.0 == name).ok_or(format!("unknown mesh axis '{name}'"));
    let mut counts = Vec::new();
    for d in dims {
        let mut c = 1;
        for a in d {
            c = mesh[axis(a)?].1.checked_mul(c).ok_or_else(overflow)?;
        }
        counts.push(c);
    }
    Ok(Tiling { counts })
}

/// Tilings of every value of a Shardy sharding attribute, using the module's meshes. `None` for a replicated value.
pub(super) fn from_sdy(module: &Module, attr: &str, n: usize) -> Result<Vec<Option<Tiling>>, String> {
    parse_values(attr)?
        .into_iter()
        .map(|(mesh_name, dims)| {
            let mesh = find_mesh(module, &mesh_name)?;
            let t = tiling_from_mesh(&mesh, &dims, n)?;
            Ok(if t.is_trivial() { None } else { Some(t) })
        })
        .collect()
}

#[cfg(test)]
#[path = "../../tests/unit/sharding_tiling.rs"]
mod tests;
