//! A small PJRT client over an [`InnerPlugin`]'s table (create, list devices, compile, move arrays, execute on several
//! devices at once), which `peerless run --backend xla` uses. Written on `pjrt_sys`'s 0.54 structs; the plugins are
//! newer, and refuse an args struct smaller than their own, so each call passes its 0.54 struct followed by zeros
//! ([`Padded`]): newer fields read as "not set". Not the `pjrt` crate: its `call_execute` hands every device the same
//! output list, so with N > 1 devices all but the last device's outputs are lost.

use std::ffi::c_void;
use std::ptr::null_mut;

use pjrt_sys as sys;

use super::InnerPlugin;

/// An args struct followed by zeros, for a plugin whose version of it is larger.
#[repr(C)]
pub(crate) struct Padded<T> {
    pub args: T,
    zeros: [u64; 64],
}

impl<T: Copy> Padded<T> {
    /// `args` (a PJRT struct, `size_t struct_size` first) with its size set to cover the zeros.
    pub fn new(args: T) -> Self {
        const { assert!(size_of::<T>() >= size_of::<usize>()) };
        let mut p = Padded { args, zeros: [0; 64] };
        // SAFETY: every PJRT args struct begins with `size_t struct_size` (PJRT's C header).
        unsafe { (&raw mut p.args).cast::<usize>().write(size_of::<Self>()) };
        p
    }

    /// The pointer the plugin gets: the struct, with the zeros readable after it.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        (&raw mut *self).cast()
    }
}

/// Calls the function in `$slot` of the table with args struct `$args` (the fields given, the rest as its `new()` sets
/// them; passed padded) and returns the struct as the plugin left it; a plugin error becomes its message.
macro_rules! call {
    ($client:expr, $slot:ident, $args:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {{
        let plugin: &InnerPlugin = $client;
        // SAFETY: `api` is the plugin's PJRT_Api (live for the process); its 0.54 prefix, which `sys::PJRT_Api`
        // describes, is the start of every newer table.
        let f = unsafe { (*plugin.api().cast::<sys::PJRT_Api>()).$slot };
        match f {
            None => Err(format!("{}: the plugin has no {}", plugin.path().display(), stringify!($slot))),
            Some(f) => {
                let mut padded = Padded::new(sys::$args { $($field $(: $value)?,)* ..sys::$args::new() });
                // SAFETY: the slot's own args struct, filled as its C header says and padded with zeros to the plugin's
                // size; pointers in it are live for the call (each caller's SAFETY note says which).
                let err = unsafe { f(padded.as_mut_ptr()) };
                if err.is_null() {
                    Ok(padded.args)
                } else {
                    Err(format!("{}: {}", stringify!($slot), plugin.take_error(err.cast::<c_void>())))
                }
            }
        }
    }};
}

/// One `name=int64` create option (the CPU plugin's `cpu_device_count`).
pub type IntOption<'a> = (&'a str, i64);

/// A PJRT client of the plugin, destroyed on drop (after every buffer and executable of it).
#[derive(Debug)]
pub struct Client {
    plugin: &'static InnerPlugin,
    ptr: *mut sys::PJRT_Client,
}

/// A device of a client: its PJRT handle and global id.
#[derive(Clone, Debug)]
pub struct Device {
    ptr: *mut sys::PJRT_Device,
    pub id: i32,
    /// The device kind, as the plugin names it ("cpu", "NVIDIA H200").
    pub kind: String,
}

/// The addressable devices of `client`, in its order, with their ids and kinds: what [`Client::devices`] lists, for a
/// client made through the plugin's table by someone else (the wrapper's `PJRT_Client_Create` reads the kind of the
/// client XLA just made).
///
/// # Safety
/// `client` is a live client of `plugin` for the call.
pub unsafe fn addressable_devices(plugin: &InnerPlugin, client: *mut sys::PJRT_Client) -> Result<Vec<Device>, String> {
    let a = call!(plugin, PJRT_Client_AddressableDevices, PJRT_Client_AddressableDevices_Args { client })?;
    let ptrs: &[*mut sys::PJRT_Device] = if a.num_addressable_devices == 0 {
        &[]
    } else {
        // SAFETY: the client owns an array of `num_addressable_devices` device pointers.
        unsafe { std::slice::from_raw_parts(a.addressable_devices, a.num_addressable_devices) }
    };
    let mut out = Vec::new();
    for &ptr in ptrs {
        let d = call!(plugin, PJRT_Device_GetDescription, PJRT_Device_GetDescription_Args { device: ptr })?;
        let device_description = d.device_description;
        let i = call!(plugin, PJRT_DeviceDescription_Id, PJRT_DeviceDescription_Id_Args { device_description })?;
        let k = call!(plugin, PJRT_DeviceDescription_Kind, PJRT_DeviceDescription_Kind_Args { device_description })?;
        let kind = if k.device_kind.is_null() {
            String::new()
        } else {
            // SAFETY: the description owns `device_kind_size` bytes at `device_kind`, alive as long as the client; they
            // are copied out here.
            let b = unsafe { std::slice::from_raw_parts(k.device_kind.cast::<u8>(), k.device_kind_size) };
            String::from_utf8_lossy(b).into_owned()
        };
        out.push(Device { ptr, id: i.id, kind });
    }
    Ok(out)
}

/// A device buffer, destroyed on drop.
#[derive(Debug)]
pub struct Buffer<'c> {
    client: &'c Client,
    ptr: *mut sys::PJRT_Buffer,
}

/// A compiled, loaded executable, destroyed on drop.
#[derive(Debug)]
pub struct Executable<'c> {
    client: &'c Client,
    ptr: *mut sys::PJRT_LoadedExecutable,
}

/// `PJRT_Buffer_Type` values (PJRT's enum in `xla/pjrt/c/pjrt_c_api.h`, append-only: stable since 0.1; F8E4M3 and
/// F8E3M4 came after U2, F8E8M0FNU after them).
pub mod buffer_type {
    pub const PRED: u32 = 1;
    pub const S8: u32 = 2;
    pub const S16: u32 = 3;
    pub const S32: u32 = 4;
    pub const S64: u32 = 5;
    pub const U8: u32 = 6;
    pub const U16: u32 = 7;
    pub const U32: u32 = 8;
    pub const U64: u32 = 9;
    pub const F16: u32 = 10;
    pub const F32: u32 = 11;
    pub const F64: u32 = 12;
    pub const BF16: u32 = 13;
    pub const C64: u32 = 14;
    pub const C128: u32 = 15;
    pub const F8E5M2: u32 = 16;
    pub const F8E4M3FN: u32 = 17;
    pub const F8E4M3B11FNUZ: u32 = 18;
    pub const F8E5M2FNUZ: u32 = 19;
    pub const F8E4M3FNUZ: u32 = 20;
    pub const S4: u32 = 21;
    pub const U4: u32 = 22;
    pub const TOKEN: u32 = 23;
    pub const S2: u32 = 24;
    pub const U2: u32 = 25;
    pub const F8E4M3: u32 = 26;
    pub const F8E3M4: u32 = 27;
    pub const F8E8M0FNU: u32 = 28;

    // The values the bound header (pjrt-sys's, up to U2) has must be its enum's.
    use pjrt_sys as sys;
    const _: () = {
        assert!(PRED == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED);
        assert!(BF16 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16);
        assert!(C128 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C128);
        assert!(F8E5M2 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E5M2);
        assert!(F8E4M3FN == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3FN);
        assert!(F8E4M3B11FNUZ == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3B11FNUZ);
        assert!(F8E5M2FNUZ == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E5M2FNUZ);
        assert!(F8E4M3FNUZ == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3FNUZ);
        assert!(S4 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S4);
        assert!(U4 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U4);
        assert!(TOKEN == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_TOKEN);
        assert!(S2 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S2);
        assert!(U2 == sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U2);
    };
}

impl Client {
    /// Initializes the plugin and creates a client with the given create options.
    pub fn create(plugin: &'static InnerPlugin, options: &[IntOption<'_>]) -> Result<Client, String> {
        // Initializing twice is allowed (XLA's plugins do nothing the second time).
        call!(plugin, PJRT_Plugin_Initialize, PJRT_Plugin_Initialize_Args {})?;
        let named: Vec<sys::PJRT_NamedValue> = options
            .iter()
            .map(|(name, v)| {
                let mut n = sys::PJRT_NamedValue::new();
                n.name = name.as_ptr().cast();
                n.name_size = name.len();
                n.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
                n.__bindgen_anon_1.int64_value = *v;
                n.value_size = 1;
                n
            })
            .collect();
        // SAFETY (the call): `named` and the option names outlive the call.
        let a = call!(
            plugin,
            PJRT_Client_Create,
            PJRT_Client_Create_Args { create_options: named.as_ptr(), num_options: named.len() }
        )?;
        if a.client.is_null() {
            return Err(format!("{}: PJRT_Client_Create returned no client", plugin.path().display()));
        }
        Ok(Client { plugin, ptr: a.client })
    }

    /// The client's addressable devices, in its order.
    pub fn devices(&self) -> Result<Vec<Device>, String> {
        // SAFETY: `ptr` is this client, alive until drop.
        unsafe { addressable_devices(self.plugin, self.ptr) }
    }

    /// Compiles a serialized HloModuleProto with serialized `CompileOptionsProto` bytes.
    pub fn compile_hlo(&self, module: &[u8], options: &[u8]) -> Result<Executable<'_>, String> {
        const FORMAT: &str = "hlo";
        let mut program = Padded::new(sys::PJRT_Program::new());
        let program_ptr = program.as_mut_ptr();
        let program = &mut program.args;
        // PJRT reads the code only (the header's `char*` is not const).
        program.code = module.as_ptr().cast_mut().cast();
        program.code_size = module.len();
        program.format = FORMAT.as_ptr().cast();
        program.format_size = FORMAT.len();
        // SAFETY (the call): `program`, `module` and `options` outlive the call.
        let a = call!(
            self.plugin,
            PJRT_Client_Compile,
            PJRT_Client_Compile_Args {
                client: self.ptr,
                program: program_ptr,
                compile_options: options.as_ptr().cast(),
                compile_options_size: options.len(),
            }
        )?;
        Ok(Executable { client: self, ptr: a.executable })
    }

    /// Copies a dense row-major host array of PJRT type `ty` to `device`.
    pub fn buffer_from_host(&self, data: &[u8], ty: u32, dims: &[i64], device: &Device) -> Result<Buffer<'_>, String> {
        // SAFETY (the call): `data` and `dims` outlive the call, which copies them (before it returns, so `data` may go
        // right after).
        let a = call!(
            self.plugin,
            PJRT_Client_BufferFromHostBuffer,
            PJRT_Client_BufferFromHostBuffer_Args {
                client: self.ptr,
                data: data.as_ptr().cast(),
                type_: ty,
                dims: dims.as_ptr(),
                num_dims: dims.len(),
                host_buffer_semantics: sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
                device: device.ptr,
            }
        )?;
        let buffer = Buffer { client: self, ptr: a.buffer };
        self.await_event(a.done_with_host_buffer)?;
        Ok(buffer)
    }

    /// Waits for `event` (null: nothing to wait for), then destroys it.
    fn await_event(&self, event: *mut sys::PJRT_Event) -> Result<(), String> {
        if event.is_null() {
            return Ok(());
        }
        let r = call!(self.plugin, PJRT_Event_Await, PJRT_Event_Await_Args { event });
        let _ = call!(self.plugin, PJRT_Event_Destroy, PJRT_Event_Destroy_Args { event });
        r.map(drop)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Err(e) = call!(self.plugin, PJRT_Client_Destroy, PJRT_Client_Destroy_Args { client: self.ptr }) {
            eprintln!("warning: {e}");
        }
    }
}

impl Executable<'_> {
    /// Outputs per device (a tuple result counts its elements).
    pub fn num_outputs(&self) -> Result<usize, String> {
        let plugin = self.client.plugin;
        let g = call!(
            plugin,
            PJRT_LoadedExecutable_GetExecutable,
            PJRT_LoadedExecutable_GetExecutable_Args { loaded_executable: self.ptr }
        )?;
        let executable = g.executable;
        let r = call!(plugin, PJRT_Executable_NumOutputs, PJRT_Executable_NumOutputs_Args { executable });
        let _ = call!(plugin, PJRT_Executable_Destroy, PJRT_Executable_Destroy_Args { executable });
        r.map(|n| n.num_outputs)
    }

    /// Runs on every device of the executable's device assignment at once: `args[d]` are device d's arguments (buffers
    /// on that device). Returns every device's outputs, after every device finished.
    pub fn execute<'c>(&'c self, args: &[Vec<&Buffer<'c>>]) -> Result<Vec<Vec<Buffer<'c>>>, String> {
        let num_outputs = self.num_outputs()?;
        let n = args.len();
        let num_args = args.first().map_or(0, Vec::len);
        if args.iter().any(|a| a.len() != num_args) {
            return Err("every device needs the same number of arguments".into());
        }
        let arg_ptrs: Vec<Vec<*mut sys::PJRT_Buffer>> =
            args.iter().map(|a| a.iter().map(|b| b.ptr).collect()).collect();
        let arg_lists: Vec<*const *mut sys::PJRT_Buffer> = arg_ptrs.iter().map(|v| v.as_ptr()).collect();
        // One output list per device (the bug this module exists for: see the module docs).
        let mut outputs: Vec<Vec<*mut sys::PJRT_Buffer>> = (0..n).map(|_| vec![null_mut(); num_outputs]).collect();
        let output_lists: Vec<*mut *mut sys::PJRT_Buffer> = outputs.iter_mut().map(|v| v.as_mut_ptr()).collect();
        let mut events: Vec<*mut sys::PJRT_Event> = vec![null_mut(); n];
        let mut options = Padded::new(sys::PJRT_ExecuteOptions::new());
        // SAFETY (the call): the argument lists (n × num_args live buffers), the n output lists of num_outputs slots
        // and the n event slots outlive the call, which fills them.
        call!(
            self.client.plugin,
            PJRT_LoadedExecutable_Execute,
            PJRT_LoadedExecutable_Execute_Args {
                executable: self.ptr,
                options: options.as_mut_ptr(),
                argument_lists: arg_lists.as_ptr(),
                num_devices: n,
                num_args,
                output_lists: output_lists.as_ptr(),
                device_complete_events: events.as_mut_ptr(),
            }
        )?;
        let outputs: Vec<Vec<Buffer<'c>>> = outputs
            .into_iter()
            .map(|v| v.into_iter().map(|ptr| Buffer { client: self.client, ptr }).collect())
            .collect();
        // Every event awaited (and destroyed), whatever the others give; the first error is the answer.
        let awaited: Vec<Result<(), String>> = events.into_iter().map(|e| self.client.await_event(e)).collect();
        awaited.into_iter().find_map(Result::err).map_or(Ok(outputs), Err)
    }
}

impl Drop for Executable<'_> {
    fn drop(&mut self) {
        let plugin = self.client.plugin;
        if let Err(e) =
            call!(plugin, PJRT_LoadedExecutable_Destroy, PJRT_LoadedExecutable_Destroy_Args { executable: self.ptr })
        {
            eprintln!("warning: {e}");
        }
    }
}

impl Buffer<'_> {
    /// The buffer's `PJRT_Buffer_Type`.
    pub fn element_type(&self) -> Result<u32, String> {
        Ok(call!(self.client.plugin, PJRT_Buffer_ElementType, PJRT_Buffer_ElementType_Args { buffer: self.ptr })?.type_)
    }

    pub fn dims(&self) -> Result<Vec<i64>, String> {
        let a = call!(self.client.plugin, PJRT_Buffer_Dimensions, PJRT_Buffer_Dimensions_Args { buffer: self.ptr })?;
        if a.num_dims == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the buffer owns `num_dims` dimensions at `dims`.
        Ok(unsafe { std::slice::from_raw_parts(a.dims, a.num_dims) }.to_vec())
    }

    /// The buffer's contents in the plugin's host layout (dense, row-major for XLA's plugins when no layout is asked
    /// for).
    pub fn to_host(&self) -> Result<Vec<u8>, String> {
        let plugin = self.client.plugin;
        // Null `dst`: the call only says how many bytes it needs.
        let a = call!(plugin, PJRT_Buffer_ToHostBuffer, PJRT_Buffer_ToHostBuffer_Args { src: self.ptr })?;
        let mut out = vec![0u8; a.dst_size];
        // SAFETY (the call): `out` has `dst_size` writable bytes and outlives the copy, awaited below before it is
        // returned.
        let a = call!(
            plugin,
            PJRT_Buffer_ToHostBuffer,
            PJRT_Buffer_ToHostBuffer_Args { src: self.ptr, dst: out.as_mut_ptr().cast(), dst_size: out.len() }
        )?;
        self.client.await_event(a.event)?;
        Ok(out)
    }
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        if let Err(e) = call!(self.client.plugin, PJRT_Buffer_Destroy, PJRT_Buffer_Destroy_Args { buffer: self.ptr }) {
            eprintln!("warning: {e}");
        }
    }
}
