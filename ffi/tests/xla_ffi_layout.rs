//! `ffi::xla_ffi::sys` against jaxlib's `xla/ffi/api/c_api.h`: a C program compiled against
//! the header prints the size, alignment and field offsets of every struct, every
//! `*_STRUCT_SIZE` and every enum value; each must equal what the Rust definitions give.
//!
//! The header comes from the jaxlib that `${PEERLESS_PYTHON:-python3}` imports
//! (`<jaxlib>/include`). Without one the test prints a "skipped" line to stderr and passes,
//! unless `CI` is set or `PEERLESS_REQUIRE_JAXLIB_HEADER=1`, where it fails.

use std::collections::BTreeMap;
use std::io::Write;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use ffi::xla_ffi::sys::*;

/// One compared quantity: its name, the C expression that computes it, Rust's value.
struct Entry {
    key: String,
    c_expr: String,
    rust: i128,
}

fn entry(key: String, c_expr: String, rust: impl TryInto<i128>) -> Entry {
    Entry { key, c_expr, rust: rust.try_into().unwrap_or(i128::MIN) }
}

/// A struct's size, alignment and the offsets of the listed fields.
macro_rules! layout {
    ($v:ident; $t:ident { $($f:ident),* $(,)? }) => {{
        let t = stringify!($t);
        $v.push(entry(format!("sizeof {t}"), format!("sizeof({t})"), size_of::<$t>()));
        $v.push(entry(format!("alignof {t}"), format!("_Alignof({t})"), align_of::<$t>()));
        $(
            let f = stringify!($f).trim_start_matches("r#");
            $v.push(entry(format!("offsetof {t}.{f}"), format!("offsetof({t}, {f})"), offset_of!($t, $f)));
        )*
    }};
}

/// Constants that have the same name in C and Rust.
macro_rules! consts {
    ($v:ident; $($c:ident),* $(,)?) => {$(
        $v.push(entry(stringify!($c).into(), stringify!($c).into(), $c));
    )*};
}

/// Enum values: Rust `$t::$c` against C `$prefix$c`.
macro_rules! values {
    ($v:ident; $t:ident, $prefix:literal, [$($c:ident),* $(,)?]) => {{
        $v.push(entry(format!("sizeof {}", stringify!($t)), format!("sizeof({})", stringify!($t)), size_of::<$t>()));
        $(
            let c = concat!($prefix, stringify!($c));
            $v.push(entry(c.into(), c.into(), $t::$c.0));
        )*
    }};
}

fn entries() -> Vec<Entry> {
    let mut v = Vec::new();
    layout!(v; XLA_FFI_InternalExtension { struct_size, r#type, next });
    layout!(v; XLA_FFI_Api_Version { struct_size, extension_start, major_version, minor_version });
    layout!(v; XLA_FFI_Error_Create_Args { struct_size, extension_start, message, errc });
    layout!(v; XLA_FFI_Error_GetDetails_Args { struct_size, extension_start, error, message, errc });
    layout!(v; XLA_FFI_Error_Destroy_Args { struct_size, extension_start, error });
    layout!(v; XLA_FFI_Buffer { struct_size, extension_start, dtype, data, rank, dims });
    layout!(v; XLA_FFI_ByteSpan { ptr, len });
    layout!(v; XLA_FFI_Scalar { dtype, value });
    layout!(v; XLA_FFI_Array { dtype, size, data });
    layout!(v; XLA_FFI_TypeId { type_id });
    layout!(v; XLA_FFI_TypeInfo { struct_size, extension_start, deleter });
    layout!(v; XLA_FFI_Args { struct_size, extension_start, size, types, args });
    layout!(v; XLA_FFI_Rets { struct_size, extension_start, size, types, rets });
    layout!(v; XLA_FFI_Attrs { struct_size, extension_start, size, types, names, attrs });
    layout!(v; XLA_FFI_CallFrame { struct_size, extension_start, api, ctx, stage, args, rets, attrs, future });
    layout!(v; XLA_FFI_Type_Register_Args { struct_size, extension_start, name, type_id, type_info });
    layout!(v; XLA_FFI_State_Set_Args { struct_size, extension_start, ctx, stage, type_id, state });
    layout!(v; XLA_FFI_State_Get_Args { struct_size, extension_start, ctx, stage, type_id, state });
    layout!(v; XLA_FFI_Stream_Get_Args { struct_size, extension_start, ctx, stream });
    layout!(v; XLA_FFI_RunId_Get_Args { struct_size, extension_start, ctx, run_id });
    layout!(v; XLA_FFI_DeviceOrdinal_Get_Args { struct_size, extension_start, ctx, device_ordinal });
    layout!(v; XLA_FFI_Metadata { struct_size, api_version, traits, state_type_id });
    layout!(v; XLA_FFI_Metadata_Extension { extension_base, metadata });
    layout!(v; XLA_FFI_Api {
        struct_size,
        extension_start,
        api_version,
        internal_api,
        XLA_FFI_Error_Create,
        XLA_FFI_Error_GetDetails,
        XLA_FFI_Error_Destroy,
        XLA_FFI_Handler_Register,
        XLA_FFI_Stream_Get,
        XLA_FFI_Type_Register,
        XLA_FFI_InvokeContext_Get,
        XLA_FFI_State_Set,
        XLA_FFI_State_Get,
        XLA_FFI_DeviceMemory_Allocate,
        XLA_FFI_DeviceMemory_Free,
        XLA_FFI_ThreadPool_Schedule,
        XLA_FFI_ThreadPool_NumThreads,
        XLA_FFI_Future_Create,
        XLA_FFI_Future_SetAvailable,
        XLA_FFI_Future_SetError,
        XLA_FFI_RunId_Get,
        XLA_FFI_DeviceOrdinal_Get,
        XLA_FFI_InvokeContext_FindExtension,
    });
    consts!(v;
        XLA_FFI_InternalExtension_STRUCT_SIZE,
        XLA_FFI_Api_Version_STRUCT_SIZE,
        XLA_FFI_Error_Create_Args_STRUCT_SIZE,
        XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE,
        XLA_FFI_Error_Destroy_Args_STRUCT_SIZE,
        XLA_FFI_Buffer_STRUCT_SIZE,
        XLA_FFI_TypeInfo_STRUCT_SIZE,
        XLA_FFI_Args_STRUCT_SIZE,
        XLA_FFI_Rets_STRUCT_SIZE,
        XLA_FFI_Attrs_STRUCT_SIZE,
        XLA_FFI_CallFrame_STRUCT_SIZE,
        XLA_FFI_Type_Register_Args_STRUCT_SIZE,
        XLA_FFI_State_Set_Args_STRUCT_SIZE,
        XLA_FFI_State_Get_Args_STRUCT_SIZE,
        XLA_FFI_Stream_Get_Args_STRUCT_SIZE,
        XLA_FFI_RunId_Get_Args_STRUCT_SIZE,
        XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE,
        XLA_FFI_Metadata_STRUCT_SIZE,
        XLA_FFI_Metadata_Extension_STRUCT_SIZE,
        XLA_FFI_Api_STRUCT_SIZE,
        XLA_FFI_API_MAJOR,
        XLA_FFI_API_MINOR,
        XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
    );
    values!(v; XLA_FFI_InternalExtension_Type, "", [XLA_FFI_Extension_Metadata]);
    values!(v; XLA_FFI_Error_Code, "XLA_FFI_Error_Code_", [
        OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS,
        PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE,
        UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED,
    ]);
    values!(v; XLA_FFI_DataType, "XLA_FFI_DataType_", [
        INVALID, PRED, S1, S2, S4, S8, S16, S32, S64, U1, U2, U4, U8, U16, U32, U64, F16, F32, F64,
        BF16, C64, C128, TOKEN, F8E5M2, F8E3M4, F8E4M3, F8E4M3FN, F8E4M3B11FNUZ, F8E5M2FNUZ,
        F8E4M3FNUZ, F4E2M1FN, F8E8M0FNU,
    ]);
    values!(v; XLA_FFI_ArgType, "XLA_FFI_ArgType_", [BUFFER]);
    values!(v; XLA_FFI_RetType, "XLA_FFI_RetType_", [BUFFER]);
    values!(v; XLA_FFI_AttrType, "XLA_FFI_AttrType_", [ARRAY, DICTIONARY, SCALAR, STRING]);
    values!(v; XLA_FFI_ExecutionStage, "XLA_FFI_ExecutionStage_", [INSTANTIATE, PREPARE, INITIALIZE, EXECUTE, RECORD]);
    v.push(entry(
        "sizeof XLA_FFI_Handler_Traits".into(),
        "sizeof(XLA_FFI_Handler_Traits)".into(),
        size_of::<XLA_FFI_Handler_Traits>(),
    ));
    v
}

/// jaxlib's include directory, or why there is none.
fn jaxlib_include() -> Result<PathBuf, String> {
    let python = std::env::var("PEERLESS_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))"])
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{python} cannot import jaxlib: {}", err.trim().lines().last().unwrap_or("")));
    }
    let inc = Path::new(String::from_utf8_lossy(&out.stdout).trim()).join("include");
    if !inc.join("xla/ffi/api/c_api.h").is_file() {
        return Err(format!("{} has no xla/ffi/api/c_api.h", inc.display()));
    }
    Ok(inc)
}

/// The host's target triple (`rustc -vV`), for the `cc` crate outside a build script.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc).arg("-vV").output().expect("rustc -vV");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find_map(|l| l.strip_prefix("host: ")).expect("a host line in rustc -vV").trim().to_string()
}

/// Compiles `source` against `include` and returns what the program prints.
fn run_c(include: &Path, source: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("xla_ffi_layout");
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, source).expect("write C source");
    let host = host_triple();
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .target(&host)
        .host(&host)
        .opt_level(0)
        .try_get_compiler()
        .expect("a C compiler");
    let out = compiler
        .to_command()
        .arg("-std=c11")
        .arg("-I")
        .arg(include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run the C compiler");
    assert!(out.status.success(), "compiling {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(run.status.success(), "{} failed", exe.display());
    String::from_utf8(run.stdout).expect("UTF-8 output")
}

#[test]
fn layout_matches_jaxlib_header() {
    let include = match jaxlib_include() {
        Ok(inc) => inc,
        Err(why) => {
            let required = std::env::var("CI").is_ok_and(|v| !v.is_empty())
                || std::env::var("PEERLESS_REQUIRE_JAXLIB_HEADER").is_ok_and(|v| v == "1");
            assert!(!required, "no jaxlib header ({why}); CI / PEERLESS_REQUIRE_JAXLIB_HEADER=1 require it");
            // Written to the real stderr, past the test harness's capture, so the skip shows.
            let _ = writeln!(
                std::io::stderr(),
                "xla_ffi_layout: skipped: no jaxlib header ({why}); set PEERLESS_PYTHON to a Python with jaxlib"
            );
            return;
        }
    };

    let entries = entries();
    let mut c =
        String::from("#include <stddef.h>\n#include <stdio.h>\n#include \"xla/ffi/api/c_api.h\"\nint main(void) {\n");
    for e in &entries {
        c.push_str(&format!("  printf(\"%s %lld\\n\", \"{}\", (long long)({}));\n", e.key, e.c_expr));
    }
    c.push_str("  return 0;\n}\n");
    let printed: BTreeMap<String, i128> = run_c(&include, &c)
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("`key value` lines");
            (k.to_string(), v.parse().expect("an integer"))
        })
        .collect();

    let mismatches: Vec<String> = entries
        .iter()
        .filter(|e| printed.get(&e.key) != Some(&e.rust))
        .map(|e| format!("{}: C {:?}, Rust {}", e.key, printed.get(&e.key), e.rust))
        .collect();
    assert!(mismatches.is_empty(), "layout differs from {}:\n{}", include.display(), mismatches.join("\n"));
    assert_eq!(printed.len(), entries.len(), "duplicate keys");
}
