//! npz input/output in the CLI's naming scheme, and seeded random inputs.
//!
//! Naming: device `d`'s entry parameter `i` is the array [`param_name`]`(i, d)` = `p{i}_d{d}`; leaf `j` of device `d`'s
//! entry result (leaves flattened depth-first; a non-tuple result is leaf 0) is [`output_name`]`(j, d)` = `o{j}_d{d}`.
//! In partition mode each array holds that device's local shard ([`crate::local_param_shapes`]).
//!
//! dtypes: numpy `bool`↔pred, `int8..int64`↔s8..s64, `uint8..uint64`↔u8..u64, `float16`↔f16, `float32`↔f32,
//! `float64`↔f64. numpy has no bfloat16, so bf16 is stored as `uint16` raw bits; F8 variants and s4/u4 (one element per
//! byte) as `uint8` raw bytes. Reading therefore yields the numpy type, and [`to_type`] reinterprets it as the type the
//! caller expects. [`inputs_from_npz`] does that for a module's parameters and checks shapes; [`outputs_to_npz`] writes
//! every device's results.
//!
//! CLI glue: [`random_inputs`] (seeded with ChaCha8: floats uniform in [-1, 1), signed ints in [-8, 8), unsigned in [0,
//! 16), pred fair coin), [`inputs_from_npz`], [`inputs_to_npz`], [`outputs_to_npz`].

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use hlo::{Array, ArrayShape, Element, Literal, Module, PrimitiveType, Shape};
use npyz::WriterBuilder;
use rand::{Rng, SeedableRng};

use crate::RunConfig;

/// npz I/O errors.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: array '{name}': {why}")]
    Array { path: String, name: String, why: String },
    #[error("{0}")]
    Mismatch(String),
}

/// `p{i}_d{d}`: device `d`'s entry parameter `i`.
pub fn param_name(i: usize, d: usize) -> String {
    format!("p{i}_d{d}")
}

/// `o{j}_d{d}`: leaf `j` (depth-first) of device `d`'s entry result.
pub fn output_name(j: usize, d: usize) -> String {
    format!("o{j}_d{d}")
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> IoError + '_ {
    move |source| IoError::Io { path: path.display().to_string(), source }
}

/// The numpy storage type of an element type (bf16 → u16 bits; F8, s4, u4 → u8 bytes).
pub fn storage_type(ty: PrimitiveType) -> Option<PrimitiveType> {
    use PrimitiveType::*;
    Some(match ty {
        Bf16 => U16,
        S4 | U4 => U8,
        t if t.is_f8() => U8,
        Pred | S8 | S16 | S32 | S64 | U8 | U16 | U32 | U64 | F16 | F32 | F64 => ty,
        _ => return None,
    })
}

/// Reinterprets an array read from npz as `ty`: identity when the types already agree, u16 bits → bf16, u8 bytes →
/// F8/s4/u4. `None` if the stored type does not fit `ty`.
pub fn to_type(a: Array, ty: PrimitiveType) -> Option<Array> {
    if a.shape.ty == ty {
        return Some(a);
    }
    if storage_type(ty) != Some(a.shape.ty) {
        return None;
    }
    Some(Array { shape: ArrayShape::new(ty, a.shape.dims), data: a.data })
}

/// An npy file's values as `T`'s element type and little-endian bytes.
fn read_as<T: npyz::Deserialize + Element>(file: npyz::NpyFile<&[u8]>) -> std::io::Result<(PrimitiveType, Vec<u8>)> {
    let v = file.into_vec::<T>()?;
    Ok((T::TYPE, Array::from_slice(vec![v.len() as i64], &v).data))
}

/// Reads every array of an npz file (types as numpy stored them).
pub fn read_npz(path: impl AsRef<Path>) -> Result<BTreeMap<String, Array>, IoError> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    read_npz_from(path, std::io::BufReader::new(file))
}

/// Reads every array of an npz archive held in memory (`path` names it in errors).
pub fn read_npz_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> Result<BTreeMap<String, Array>, IoError> {
    read_npz_from(path.as_ref(), std::io::Cursor::new(bytes))
}

/// Largest element count accepted from one npy header (2^40, as `hlo` bounds shapes).
const MAX_NPY_ELEMENTS: u64 = 1 << 40;

/// The shape of an array read from a file: no negative dimension, at most [`MAX_NPY_ELEMENTS`] elements.
fn array_shape(ty: PrimitiveType, dims: Vec<i64>) -> Result<ArrayShape, String> {
    let mut count: u64 = 1;
    for &d in &dims {
        if d < 0 {
            return Err(format!("negative dimension in {dims:?}"));
        }
        count = count.checked_mul(d as u64).filter(|&c| c <= MAX_NPY_ELEMENTS).ok_or("array too large")?;
    }
    Ok(ArrayShape::new(ty, dims))
}

fn read_npz_from<R: std::io::Read + std::io::Seek>(path: &Path, reader: R) -> Result<BTreeMap<String, Array>, IoError> {
    let mut npz = npyz::npz::NpzArchive::new(reader).map_err(io_err(path))?;
    let names: Vec<String> = npz.array_names().map(str::to_string).collect();
    let mut out = BTreeMap::new();
    for name in names {
        let bad = |why: String| IoError::Array { path: path.display().to_string(), name: name.clone(), why };
        // Read the member's bytes first (as much as it really holds, not what a header claims), and check the npy
        // header's shape before npyz multiplies it out.
        let mut bytes = Vec::new();
        {
            use std::io::Read;
            let mut member = npz
                .zip_archive()
                .by_name(&format!("{name}.npy"))
                .map_err(|e| bad(format!("cannot open the archive member: {e}")))?;
            member.read_to_end(&mut bytes).map_err(|e| bad(format!("cannot read the archive member: {e}")))?;
        }
        check_npy_shape(&bytes).map_err(bad)?;
        let file = npyz::NpyFile::new(bytes.as_slice()).map_err(|e| bad(e.to_string()))?;
        let dims: Vec<i64> = file.shape().iter().map(|&d| d as i64).collect();
        if file.order() == npyz::Order::Fortran && dims.iter().filter(|&&d| d > 1).count() > 1 {
            return Err(bad("Fortran-ordered arrays are not supported".into()));
        }
        let dtype = file.dtype();
        let npyz::DType::Plain(ts) = &dtype else { return Err(bad(format!("unsupported dtype {}", dtype.descr()))) };
        use npyz::TypeChar::*;
        let read = match (ts.type_char(), ts.size_field()) {
            (Bool, 1) => read_as::<bool>(file),
            (Int, 1) => read_as::<i8>(file),
            (Int, 2) => read_as::<i16>(file),
            (Int, 4) => read_as::<i32>(file),
            (Int, 8) => read_as::<i64>(file),
            (Uint, 1) => read_as::<u8>(file),
            (Uint, 2) => read_as::<u16>(file),
            (Uint, 4) => read_as::<u32>(file),
            (Uint, 8) => read_as::<u64>(file),
            (Float, 2) => read_as::<f16>(file),
            (Float, 4) => read_as::<f32>(file),
            (Float, 8) => read_as::<f64>(file),
            _ => Err(std::io::Error::other(format!("unsupported dtype {ts}"))),
        };
        let (ty, data) = read.map_err(|e| bad(e.to_string()))?;
        let shape = array_shape(ty, dims).map_err(bad)?;
        let a = Array::new(shape, data).map_err(|e| bad(e.to_string()))?;
        out.insert(name, a);
    }
    Ok(out)
}

/// Checks the `'shape': (...)` entry of an npy header: every dimension parses, their product fits in
/// [`MAX_NPY_ELEMENTS`], and the data that follows the header holds at least that many bytes' worth of 1-byte elements.
/// Headers it cannot read are left to npyz.
fn check_npy_shape(bytes: &[u8]) -> Result<(), String> {
    let (header_len, start) = match bytes.get(6) {
        Some(1) if bytes.len() >= 10 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10usize),
        Some(2 | 3) if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        _ => return Ok(()),
    };
    let Some(header) = bytes.get(start..start.saturating_add(header_len)) else {
        return Err(format!("npy header claims {header_len} bytes, the member has {}", bytes.len()));
    };
    let header = String::from_utf8_lossy(header);
    let Some(at) = header.find("'shape'") else { return Ok(()) };
    let rest = &header[at + "'shape'".len()..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else { return Ok(()) };
    if close < open {
        return Ok(());
    }
    let mut count: u64 = 1;
    for dim in rest[open + 1..close].split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let d: u64 = dim.trim_end_matches('L').parse().map_err(|_| format!("npy shape entry '{dim}' is not a size"))?;
        count = count
            .checked_mul(d)
            .filter(|&c| c <= MAX_NPY_ELEMENTS)
            .ok_or_else(|| format!("npy shape {} has more than 2^40 elements", &rest[open..=close]))?;
    }
    let data = bytes.len() - start - header_len;
    if count > data as u64 {
        return Err(format!(
            "npy shape {} has {count} elements but only {data} data bytes follow",
            &rest[open..=close]
        ));
    }
    Ok(())
}

fn write_one<T: npyz::AutoSerialize + Element>(
    npz: &mut npyz::npz::NpzWriter<std::io::BufWriter<std::fs::File>>,
    name: &str,
    a: &Array,
) -> std::io::Result<()> {
    let dims: Vec<u64> = a.shape.dims.iter().map(|&d| d.max(0) as u64).collect();
    let mut w = npz.array::<T>(name, Default::default())?.default_dtype().shape(&dims).begin_nd()?;
    w.extend(a.data.chunks_exact(std::mem::size_of::<T>()).map(T::from_le))?;
    w.finish()
}

/// Writes arrays to an npz file (bf16 as uint16 bits, F8/s4/u4 as uint8 bytes).
pub fn write_npz(path: impl AsRef<Path>, arrays: &BTreeMap<String, Array>) -> Result<(), IoError> {
    let path = path.as_ref();
    let mut npz = npyz::npz::NpzWriter::create(path).map_err(io_err(path))?;
    for (name, a) in arrays {
        use PrimitiveType::*;
        let st = storage_type(a.shape.ty).ok_or_else(|| IoError::Array {
            path: path.display().to_string(),
            name: name.clone(),
            why: format!("type {} cannot be stored", a.shape.ty),
        })?;
        let r = match st {
            Pred => write_one::<bool>(&mut npz, name, a),
            S8 => write_one::<i8>(&mut npz, name, a),
            S16 => write_one::<i16>(&mut npz, name, a),
            S32 => write_one::<i32>(&mut npz, name, a),
            S64 => write_one::<i64>(&mut npz, name, a),
            U8 => write_one::<u8>(&mut npz, name, a),
            U16 => write_one::<u16>(&mut npz, name, a),
            U32 => write_one::<u32>(&mut npz, name, a),
            U64 => write_one::<u64>(&mut npz, name, a),
            F16 => write_one::<f16>(&mut npz, name, a),
            F32 => write_one::<f32>(&mut npz, name, a),
            _ => write_one::<f64>(&mut npz, name, a),
        };
        r.map_err(io_err(path))?;
    }
    // Dropping the writer finishes the zip; do it explicitly to see errors.
    npz.zip_writer().finish().map_err(|e| io_err(path)(std::io::Error::other(e.to_string())))?;
    Ok(())
}

fn random_array(rng: &mut rand_chacha::ChaCha8Rng, shape: &ArrayShape) -> Result<Array, IoError> {
    use PrimitiveType::*;
    let n = shape.element_count();
    let es = shape.ty.byte_size();
    let mut data = vec![0u8; shape.byte_size()];
    for i in 0..n {
        let out = &mut data[i * es..(i + 1) * es];
        match shape.ty {
            Pred => rng.random::<bool>().write_le(out),
            S8 => rng.random_range(-8i8..8).write_le(out),
            S16 => rng.random_range(-8i16..8).write_le(out),
            S32 => rng.random_range(-8i32..8).write_le(out),
            S64 => rng.random_range(-8i64..8).write_le(out),
            U8 => rng.random_range(0u8..16).write_le(out),
            U16 => rng.random_range(0u16..16).write_le(out),
            U32 => rng.random_range(0u32..16).write_le(out),
            U64 => rng.random_range(0u64..16).write_le(out),
            F16 => f16::from_f32(rng.random_range(-1f32..1.0)).write_le(out),
            Bf16 => bf16::from_f32(rng.random_range(-1f32..1.0)).write_le(out),
            F32 => rng.random_range(-1f32..1.0).write_le(out),
            F64 => rng.random_range(-1f64..1.0).write_le(out),
            S4 => out[0] = rng.random_range(-8i8..8) as u8,
            U4 => out[0] = rng.random_range(0u8..16),
            _ => out.iter_mut().for_each(|b| *b = rng.random()),
        }
    }
    Ok(Array { shape: ArrayShape::new(shape.ty, shape.dims.clone()), data })
}

fn random_literal(rng: &mut rand_chacha::ChaCha8Rng, shape: &Shape) -> Result<Literal, IoError> {
    Ok(match shape {
        Shape::Array(a) => Literal::Array(random_array(rng, a)?),
        Shape::Tuple(t) => Literal::Tuple(t.iter().map(|s| random_literal(rng, s)).collect::<Result<_, _>>()?),
        Shape::Token => Literal::Token,
    })
}

/// Seeded random entry arguments, `[device][parameter]`, of each device's local shapes.
pub fn random_inputs(module: &Module, cfg: &RunConfig, seed: u64) -> Result<Vec<Vec<Literal>>, IoError> {
    let shapes = crate::local_param_shapes(module, cfg)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    shapes.iter().map(|dev| dev.iter().map(|s| random_literal(&mut rng, s)).collect()).collect()
}

/// Builds entry arguments `[device][parameter]` from npz arrays named `p{i}_d{d}` (tuple parameters are not supported:
/// use one array per array parameter), converting stored types to the parameter types and checking local shapes.
pub fn inputs_from_npz(
    module: &Module,
    cfg: &RunConfig,
    arrays: &BTreeMap<String, Array>,
) -> Result<Vec<Vec<Literal>>, IoError> {
    let shapes = crate::local_param_shapes(module, cfg)?;
    let mut out = Vec::new();
    for (d, dev) in shapes.iter().enumerate() {
        let mut args = Vec::new();
        for (i, s) in dev.iter().enumerate() {
            let name = param_name(i, d);
            let want =
                s.as_array().ok_or_else(|| IoError::Mismatch(format!("parameter {i} has non-array shape {s}")))?;
            let a = arrays.get(&name).ok_or_else(|| IoError::Mismatch(format!("missing array '{name}'")))?;
            let stored = a.shape.ty;
            let a = to_type(a.clone(), want.ty).ok_or_else(|| {
                IoError::Mismatch(format!("'{name}': stored as {stored}, parameter {i} is {}", want.ty))
            })?;
            if a.shape.dims != want.dims {
                return Err(IoError::Mismatch(format!(
                    "'{name}': parameter {i} on device {d} expects {want}, got {}",
                    a.shape
                )));
            }
            args.push(Literal::Array(a));
        }
        out.push(args);
    }
    Ok(out)
}

/// Arguments `[device][parameter]` as npz arrays `p{i}_d{d}`.
pub fn inputs_to_npz(args: &[Vec<Literal>]) -> Result<BTreeMap<String, Array>, IoError> {
    let mut out = BTreeMap::new();
    for (d, dev) in args.iter().enumerate() {
        for (i, l) in dev.iter().enumerate() {
            let a = l.as_array().ok_or_else(|| IoError::Mismatch(format!("parameter {i} is not an array")))?;
            out.insert(param_name(i, d), a.clone());
        }
    }
    Ok(out)
}

/// Every device's result leaves as npz arrays `o{j}_d{d}`.
pub fn outputs_to_npz(results: &[Literal]) -> BTreeMap<String, Array> {
    let mut out = BTreeMap::new();
    for (d, r) in results.iter().enumerate() {
        for (j, a) in r.leaves().into_iter().enumerate() {
            out.insert(output_name(j, d), a.clone());
        }
    }
    out
}
