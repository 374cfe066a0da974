//! A small PJRT framework in Rust for the resource and concurrency tests: it uses nothing but
//! the function table (`plugin::api()`), as a C/C++ framework would, and panics with the
//! plugin's message on any error.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::ptr::null_mut;

use hlo::{Array, PrimitiveType};
use plugin::pjrt_sys::*;

pub fn api() -> &'static PJRT_Api {
    // SAFETY: `plugin::api()` returns a pointer to a table that lives for the process.
    unsafe { &*plugin::api() }
}

/// Panics with the plugin's message if `e` is an error (destroying it).
pub fn ok(e: *mut PJRT_Error, what: &str) {
    if let Some(m) = error_message(e) {
        panic!("{what}: {m}");
    }
}

/// The message of `e` (destroyed), or `None` for success.
pub fn error_message(e: *mut PJRT_Error) -> Option<String> {
    if e.is_null() {
        return None;
    }
    let mut m = PJRT_Error_Message_Args::new();
    m.error = e;
    let mut d = PJRT_Error_Destroy_Args::new();
    d.error = e;
    // SAFETY: `e` is a live error from the plugin, destroyed exactly once after reading.
    unsafe {
        (api().PJRT_Error_Message.unwrap())(&mut m);
        let text =
            String::from_utf8_lossy(std::slice::from_raw_parts(m.message.cast::<u8>(), m.message_size)).into_owned();
        (api().PJRT_Error_Destroy.unwrap())(&mut d);
        Some(text)
    }
}

/// A client handle; raw pointers travel between threads as this (the plugin's objects are
/// thread-safe for the operations PJRT allows concurrently).
#[derive(Clone, Copy)]
pub struct Client(pub usize);
#[derive(Clone, Copy)]
pub struct Loaded(pub usize);
#[derive(Clone, Copy)]
pub struct Buffer(pub usize);

pub fn create_client(num_devices: i64) -> Client {
    create_client_with_flags(num_devices, None)
}

/// A client with `num_devices` (host backend) and, if given, the create option
/// `peerless_flags` (`"--collective_timeout_ms=300"`).
pub fn create_client_with_flags(num_devices: i64, flags: Option<&str>) -> Client {
    let name = "num_devices";
    let mut opts = vec![PJRT_NamedValue::new()];
    opts[0].name = name.as_ptr().cast();
    opts[0].name_size = name.len();
    opts[0].type_ = PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
    opts[0].__bindgen_anon_1.int64_value = num_devices;
    if let Some(flags) = flags {
        let name = "peerless_flags";
        let mut o = PJRT_NamedValue::new();
        o.name = name.as_ptr().cast();
        o.name_size = name.len();
        o.type_ = PJRT_NamedValue_Type_PJRT_NamedValue_kString;
        o.__bindgen_anon_1.string_value = flags.as_ptr().cast();
        o.value_size = flags.len();
        opts.push(o);
    }
    let mut c = PJRT_Client_Create_Args::new();
    c.create_options = opts.as_ptr();
    c.num_options = opts.len();
    // SAFETY: initialised args; `opts` and the strings they point to outlive the call.
    ok(unsafe { (api().PJRT_Client_Create.unwrap())(&mut c) }, "Client_Create");
    Client(c.client as usize)
}

pub fn destroy_client(c: Client) {
    let mut a = PJRT_Client_Destroy_Args::new();
    a.client = c.0 as *mut PJRT_Client;
    // SAFETY: a live client, destroyed once.
    ok(unsafe { (api().PJRT_Client_Destroy.unwrap())(&mut a) }, "Client_Destroy");
}

pub fn devices(c: Client) -> Vec<usize> {
    let mut a = PJRT_Client_Devices_Args::new();
    a.client = c.0 as *mut PJRT_Client;
    // SAFETY: a live client; the returned array lives as long as the client.
    unsafe {
        ok((api().PJRT_Client_Devices.unwrap())(&mut a), "Client_Devices");
        std::slice::from_raw_parts(a.devices, a.num_devices).iter().map(|&p| p as usize).collect()
    }
}

/// `CompileOptionsProto { executable_build_options { num_replicas: n } }`.
pub fn replicas_options(n: u8) -> Vec<u8> {
    vec![0x1a, 0x02, 0x20, n]
}

/// Compiles a serialized `HloModuleProto` (`Err`: the plugin's message).
pub fn try_compile(c: Client, proto: &[u8], options: &[u8]) -> Result<Loaded, String> {
    let format = "hlo";
    let mut p = PJRT_Program::new();
    p.code = proto.as_ptr().cast_mut().cast();
    p.code_size = proto.len();
    p.format = format.as_ptr().cast();
    p.format_size = format.len();
    let mut a = PJRT_Client_Compile_Args::new();
    a.client = c.0 as *mut PJRT_Client;
    a.program = &p;
    a.compile_options = options.as_ptr().cast();
    a.compile_options_size = options.len();
    // SAFETY: initialised args; `p`, `proto` and `options` outlive the call.
    match error_message(unsafe { (api().PJRT_Client_Compile.unwrap())(&mut a) }) {
        None => Ok(Loaded(a.executable as usize)),
        Some(m) => Err(m),
    }
}

pub fn compile(c: Client, proto: &[u8], options: &[u8]) -> Loaded {
    try_compile(c, proto, options).unwrap_or_else(|m| panic!("Client_Compile: {m}"))
}

pub fn destroy_loaded(l: Loaded) {
    let mut a = PJRT_LoadedExecutable_Destroy_Args::new();
    a.executable = l.0 as *mut PJRT_LoadedExecutable;
    // SAFETY: a live loaded executable, destroyed once.
    ok(unsafe { (api().PJRT_LoadedExecutable_Destroy.unwrap())(&mut a) }, "LoadedExecutable_Destroy");
}

pub fn pjrt_type(ty: PrimitiveType) -> PJRT_Buffer_Type {
    plugin::runtime::to_pjrt_type(ty).expect("a PJRT type")
}

/// Uploads `a` to device `device` (a `PJRT_Device*` as usize).
pub fn upload(c: Client, device: usize, a: &Array) -> Buffer {
    let mut b = PJRT_Client_BufferFromHostBuffer_Args::new();
    b.client = c.0 as *mut PJRT_Client;
    b.data = a.data.as_ptr().cast();
    b.type_ = pjrt_type(a.shape.ty);
    (b.dims, b.num_dims) = (a.shape.dims.as_ptr(), a.shape.dims.len());
    b.device = device as *mut PJRT_Device;
    // SAFETY: initialised args; `a` outlives the call (the copy is synchronous).
    unsafe {
        ok((api().PJRT_Client_BufferFromHostBuffer.unwrap())(&mut b), "BufferFromHostBuffer");
        let mut ed = PJRT_Event_Destroy_Args::new();
        ed.event = b.done_with_host_buffer;
        ok((api().PJRT_Event_Destroy.unwrap())(&mut ed), "Event_Destroy");
    }
    Buffer(b.buffer as usize)
}

pub fn destroy_buffer(b: Buffer) {
    let mut a = PJRT_Buffer_Destroy_Args::new();
    a.buffer = b.0 as *mut PJRT_Buffer;
    // SAFETY: a live buffer, destroyed once.
    ok(unsafe { (api().PJRT_Buffer_Destroy.unwrap())(&mut a) }, "Buffer_Destroy");
}

pub fn num_outputs(l: Loaded) -> usize {
    let mut g = PJRT_LoadedExecutable_GetExecutable_Args::new();
    g.loaded_executable = l.0 as *mut PJRT_LoadedExecutable;
    // SAFETY: a live loaded executable; the executable view is destroyed here.
    unsafe {
        ok((api().PJRT_LoadedExecutable_GetExecutable.unwrap())(&mut g), "GetExecutable");
        let mut n = PJRT_Executable_NumOutputs_Args::new();
        n.executable = g.executable;
        ok((api().PJRT_Executable_NumOutputs.unwrap())(&mut n), "NumOutputs");
        let mut d = PJRT_Executable_Destroy_Args::new();
        d.executable = g.executable;
        ok((api().PJRT_Executable_Destroy.unwrap())(&mut d), "Executable_Destroy");
        n.num_outputs
    }
}

/// What one Execute call left behind: its error message, and every output and completion-event
/// slot (all null before the call).
pub struct Outcome {
    pub error: Option<String>,
    pub outs: Vec<Vec<*mut PJRT_Buffer>>,
    pub events: Vec<*mut PJRT_Event>,
}

impl Outcome {
    pub fn nothing_written(&self) -> bool {
        self.outs.iter().flatten().all(|p| p.is_null()) && self.events.iter().all(|e| e.is_null())
    }
}

/// Executes `l` on `args`, with `output_lists[null_list]` null if given.
pub fn execute_raw(l: Loaded, args: &[Vec<Buffer>], null_list: Option<usize>) -> Outcome {
    let n_out = num_outputs(l);
    let lists: Vec<Vec<*mut PJRT_Buffer>> =
        args.iter().map(|row| row.iter().map(|b| b.0 as *mut PJRT_Buffer).collect()).collect();
    let list_ptrs: Vec<*const *mut PJRT_Buffer> = lists.iter().map(|r| r.as_ptr()).collect();
    let mut outs: Vec<Vec<*mut PJRT_Buffer>> = args.iter().map(|_| vec![null_mut(); n_out]).collect();
    let out_ptrs: Vec<*mut *mut PJRT_Buffer> = outs
        .iter_mut()
        .enumerate()
        .map(|(d, r)| if Some(d) == null_list { null_mut() } else { r.as_mut_ptr() })
        .collect();
    let mut events: Vec<*mut PJRT_Event> = vec![null_mut(); args.len()];
    let mut opts = PJRT_ExecuteOptions::new();
    let mut x = PJRT_LoadedExecutable_Execute_Args::new();
    x.executable = l.0 as *mut PJRT_LoadedExecutable;
    x.options = &mut opts;
    x.argument_lists = list_ptrs.as_ptr();
    x.num_devices = args.len();
    x.num_args = args.first().map_or(0, Vec::len);
    x.output_lists = out_ptrs.as_ptr();
    x.device_complete_events = events.as_mut_ptr();
    // SAFETY: every array above has the lengths the args declare and outlives the call.
    let error = error_message(unsafe { (api().PJRT_LoadedExecutable_Execute.unwrap())(&mut x) });
    Outcome { error, outs, events }
}

/// Executes with `args[d][i]`; returns `out[d][o]` (`Err`: the plugin's message). Every
/// device's completion event is awaited and destroyed.
pub fn try_execute(l: Loaded, args: &[Vec<Buffer>]) -> Result<Vec<Vec<Buffer>>, String> {
    let Outcome { error, outs, events } = execute_raw(l, args, None);
    if let Some(m) = error {
        return Err(m);
    }
    for ev in events {
        let mut w = PJRT_Event_Await_Args::new();
        w.event = ev;
        let mut d = PJRT_Event_Destroy_Args::new();
        d.event = ev;
        // SAFETY: events the plugin just returned, destroyed once.
        unsafe {
            ok((api().PJRT_Event_Await.unwrap())(&mut w), "Event_Await");
            ok((api().PJRT_Event_Destroy.unwrap())(&mut d), "Event_Destroy");
        }
    }
    Ok(outs.into_iter().map(|r| r.into_iter().map(|p| Buffer(p as usize)).collect()).collect())
}

pub fn execute(l: Loaded, args: &[Vec<Buffer>]) -> Vec<Vec<Buffer>> {
    try_execute(l, args).unwrap_or_else(|m| panic!("Execute: {m}"))
}

/// The bytes of `b` (dense row-major).
pub fn to_host(b: Buffer) -> Vec<u8> {
    let mut t = PJRT_Buffer_ToHostBuffer_Args::new();
    t.src = b.0 as *mut PJRT_Buffer;
    // SAFETY: a live buffer; the first call asks for the size, the second fills `out`.
    unsafe {
        ok((api().PJRT_Buffer_ToHostBuffer.unwrap())(&mut t), "ToHostBuffer size");
        let mut out = vec![0u8; t.dst_size];
        t.dst = out.as_mut_ptr().cast();
        ok((api().PJRT_Buffer_ToHostBuffer.unwrap())(&mut t), "ToHostBuffer");
        let mut d = PJRT_Event_Destroy_Args::new();
        d.event = t.event;
        ok((api().PJRT_Event_Destroy.unwrap())(&mut d), "Event_Destroy");
        out
    }
}

pub fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hlo-tests/goldens")
}

/// A golden case: its serialized module, and per device its inputs and XLA's outputs.
pub struct Case {
    pub name: String,
    pub devices: usize,
    pub proto: Vec<u8>,
    pub inputs: Vec<Vec<Array>>,
    pub outputs: Vec<Vec<Array>>,
}

pub fn case(name: &str, devices: usize) -> Case {
    let dir = goldens();
    let proto = std::fs::read(dir.join(format!("{name}.pb"))).expect("golden .pb");
    let npz = interp::io::read_npz(dir.join(format!("{name}.d{devices}.npz"))).expect("golden .npz");
    let series = |prefix: char, d: usize| -> Vec<Array> {
        (0..).map_while(|i| npz.get(&format!("{prefix}{i}_d{d}")).cloned()).collect()
    };
    Case {
        name: name.into(),
        devices,
        proto,
        inputs: (0..devices).map(|d| series('p', d)).collect(),
        outputs: (0..devices).map(|d| series('o', d)).collect(),
    }
}

/// Whether `got` (an output's bytes) matches XLA's `want`: integers and other types
/// exactly, f32 to 1e-5 and f64 to 1e-9 relative.
pub fn close_to(got: &[u8], want: &Array) -> bool {
    let pairs = |n: usize| got.chunks_exact(n).zip(want.data.chunks_exact(n));
    match want.shape.ty {
        PrimitiveType::F32 => {
            got.len() == want.data.len()
                && pairs(4).all(|(a, b)| {
                    let (a, b) = (f32::from_le_bytes(a.try_into().unwrap()), f32::from_le_bytes(b.try_into().unwrap()));
                    a == b || (a - b).abs() <= 1e-5 * b.abs().max(1.0)
                })
        }
        PrimitiveType::F64 => {
            got.len() == want.data.len()
                && pairs(8).all(|(a, b)| {
                    let (a, b) = (f64::from_le_bytes(a.try_into().unwrap()), f64::from_le_bytes(b.try_into().unwrap()));
                    a == b || (a - b).abs() <= 1e-9 * b.abs().max(1.0)
                })
        }
        _ => got == want.data.as_slice(),
    }
}

/// Process resources: resident pages, open file descriptors, threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    pub rss_bytes: u64,
    pub fds: usize,
    pub threads: usize,
}

pub fn usage() -> Usage {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("resident pages");
    let count = |d: &str| std::fs::read_dir(d).map(|r| r.count()).expect(d);
    Usage { rss_bytes: pages * 4096, fds: count("/proc/self/fd"), threads: count("/proc/self/task") }
}
