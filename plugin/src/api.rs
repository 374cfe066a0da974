//! Every entry point of the PJRT C API 0.54 function table, each in the shape
//! [`crate::boundary::enter`] gives it, and the table itself.

use std::os::raw::{c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hlo::ArrayShape;
use pjrt_sys::*;
use pjrt_sys::{
    PJRT_NamedValue_Type_PJRT_NamedValue_kInt64 as KINT64, PJRT_NamedValue_Type_PJRT_NamedValue_kString as KSTRING,
};

use crate::boundary::{args, enter, enter_void, obj, obj_const, slice, string, take};
use crate::error::{Error, Result};
use crate::runtime::{
    Buffer, Client, ClientConfig, Compiled, DEVICE_KIND, Device, Event, Executable, Loaded, MEMORY_KIND, Memory,
    Topology, from_pjrt_type, gather_host, to_pjrt_type,
};

args!(
    PJRT_Error_Destroy_Args,
    PJRT_Error_Message_Args,
    PJRT_Error_GetCode_Args,
    PJRT_Plugin_Initialize_Args,
    PJRT_Plugin_Attributes_Args,
    PJRT_Event_Destroy_Args,
    PJRT_Event_IsReady_Args,
    PJRT_Event_Error_Args,
    PJRT_Event_Await_Args,
    PJRT_Event_OnReady_Args,
    PJRT_Client_Create_Args,
    PJRT_Client_Destroy_Args,
    PJRT_Client_PlatformName_Args,
    PJRT_Client_ProcessIndex_Args,
    PJRT_Client_PlatformVersion_Args,
    PJRT_Client_Devices_Args,
    PJRT_Client_AddressableDevices_Args,
    PJRT_Client_LookupDevice_Args,
    PJRT_Client_LookupAddressableDevice_Args,
    PJRT_Client_AddressableMemories_Args,
    PJRT_Client_Compile_Args,
    PJRT_Client_DefaultDeviceAssignment_Args,
    PJRT_Client_BufferFromHostBuffer_Args,
    PJRT_DeviceDescription_Id_Args,
    PJRT_DeviceDescription_ProcessIndex_Args,
    PJRT_DeviceDescription_Attributes_Args,
    PJRT_DeviceDescription_Kind_Args,
    PJRT_DeviceDescription_DebugString_Args,
    PJRT_DeviceDescription_ToString_Args,
    PJRT_Device_GetDescription_Args,
    PJRT_Device_IsAddressable_Args,
    PJRT_Device_LocalHardwareId_Args,
    PJRT_Device_AddressableMemories_Args,
    PJRT_Device_DefaultMemory_Args,
    PJRT_Device_MemoryStats_Args,
    PJRT_Memory_Id_Args,
    PJRT_Memory_Kind_Args,
    PJRT_Memory_DebugString_Args,
    PJRT_Memory_ToString_Args,
    PJRT_Memory_AddressableByDevices_Args,
    PJRT_Executable_Destroy_Args,
    PJRT_Executable_Name_Args,
    PJRT_Executable_NumReplicas_Args,
    PJRT_Executable_NumPartitions_Args,
    PJRT_Executable_NumOutputs_Args,
    PJRT_Executable_SizeOfGeneratedCodeInBytes_Args,
    PJRT_Executable_GetCostAnalysis_Args,
    PJRT_Executable_OutputMemoryKinds_Args,
    PJRT_Executable_OptimizedProgram_Args,
    PJRT_Executable_Serialize_Args,
    PJRT_LoadedExecutable_Destroy_Args,
    PJRT_LoadedExecutable_GetExecutable_Args,
    PJRT_LoadedExecutable_AddressableDevices_Args,
    PJRT_LoadedExecutable_Delete_Args,
    PJRT_LoadedExecutable_IsDeleted_Args,
    PJRT_LoadedExecutable_Execute_Args,
    PJRT_Executable_DeserializeAndLoad_Args,
    PJRT_LoadedExecutable_Fingerprint_Args,
    PJRT_Buffer_Destroy_Args,
    PJRT_Buffer_ElementType_Args,
    PJRT_Buffer_Dimensions_Args,
    PJRT_Buffer_UnpaddedDimensions_Args,
    PJRT_Buffer_DynamicDimensionIndices_Args,
    PJRT_Buffer_GetMemoryLayout_Args,
    PJRT_Buffer_OnDeviceSizeInBytes_Args,
    PJRT_Buffer_Device_Args,
    PJRT_Buffer_Memory_Args,
    PJRT_Buffer_Delete_Args,
    PJRT_Buffer_IsDeleted_Args,
    PJRT_Buffer_CopyToDevice_Args,
    PJRT_Buffer_ToHostBuffer_Args,
    PJRT_Buffer_IsOnCpu_Args,
    PJRT_Buffer_ReadyEvent_Args,
    PJRT_Buffer_UnsafePointer_Args,
    PJRT_Buffer_IncreaseExternalReferenceCount_Args,
    PJRT_Buffer_DecreaseExternalReferenceCount_Args,
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args,
    PJRT_CopyToDeviceStream_Destroy_Args,
    PJRT_CopyToDeviceStream_AddChunk_Args,
    PJRT_CopyToDeviceStream_TotalBytes_Args,
    PJRT_CopyToDeviceStream_GranuleSize_Args,
    PJRT_CopyToDeviceStream_CurrentBytes_Args,
    PJRT_TopologyDescription_Create_Args,
    PJRT_TopologyDescription_Destroy_Args,
    PJRT_TopologyDescription_PlatformName_Args,
    PJRT_TopologyDescription_PlatformVersion_Args,
    PJRT_TopologyDescription_GetDeviceDescriptions_Args,
    PJRT_TopologyDescription_Serialize_Args,
    PJRT_TopologyDescription_Attributes_Args,
    PJRT_Compile_Args,
    PJRT_Executable_OutputElementTypes_Args,
    PJRT_Executable_OutputDimensions_Args,
    PJRT_Buffer_CopyToMemory_Args,
    PJRT_Client_CreateViewOfDeviceBuffer_Args,
    PJRT_Executable_Fingerprint_Args,
    PJRT_Client_TopologyDescription_Args,
    PJRT_Executable_GetCompiledMemoryStats_Args,
    PJRT_Memory_Kind_Id_Args,
    PJRT_ExecuteContext_Create_Args,
    PJRT_ExecuteContext_Destroy_Args,
);

/// An entry point returning `PJRT_Error*`.
macro_rules! entry {
    ($name:ident($a:ident: $t:ident) $body:block) => {
        unsafe extern "C" fn $name($a: *mut $t) -> *mut PJRT_Error {
            let body = |$a: &mut $t| -> Result<()> { $body };
            // SAFETY: the PJRT contract: `args` is null or a valid args struct for this call.
            unsafe { enter(stringify!($name), $a, body) }
        }
    };
}

/// An entry point that always answers UNIMPLEMENTED (after the usual checks).
macro_rules! unimplemented_entry {
    ($name:ident, $t:ident, $why:expr) => {
        unsafe extern "C" fn $name(a: *mut $t) -> *mut PJRT_Error {
            // SAFETY: the PJRT contract: `args` is null or a valid args struct for this call.
            unsafe {
                enter(stringify!($name), a, |_: &mut $t| -> Result<()> {
                    Err(Error::unimplemented(format!("peerless: {} is not implemented: {}", stringify!($name), $why)))
                })
            }
        }
    };
}

fn str_out(s: &str) -> (*const c_char, usize) {
    (s.as_ptr().cast(), s.len())
}

fn client_of<'a>(p: *mut PJRT_Client) -> Result<&'a Client> {
    obj(p, "client")
}
fn device_of<'a>(p: *mut PJRT_Device) -> Result<&'a Device> {
    obj(p, "device")
}
fn desc_of<'a>(p: *mut PJRT_DeviceDescription) -> Result<&'a Device> {
    obj(p, "device description")
}
fn memory_of<'a>(p: *mut PJRT_Memory) -> Result<&'a Memory> {
    obj(p, "memory")
}
fn buffer_of<'a>(p: *mut PJRT_Buffer) -> Result<&'a Buffer> {
    obj(p, "buffer")
}
fn exec_of<'a>(p: *mut PJRT_Executable) -> Result<&'a Executable> {
    obj(p, "executable")
}
fn loaded_of<'a>(p: *mut PJRT_LoadedExecutable) -> Result<&'a Loaded> {
    obj(p, "loaded executable")
}
fn event_of<'a>(p: *mut PJRT_Event) -> Result<&'a Event> {
    obj(p, "event")
}
fn buffer_client<'a>(b: &Buffer) -> Result<&'a Client> {
    obj_const(b.client, "buffer's client")
}

// ---- errors ---------------------------------------------------------------------------

unsafe extern "C" fn error_destroy(a: *mut PJRT_Error_Destroy_Args) {
    // SAFETY: the PJRT contract: `args` is null or a valid args struct for this call.
    unsafe {
        enter_void("PJRT_Error_Destroy", a, |a| {
            drop(take::<Error, _>(a.error));
            Ok(())
        })
    }
}

unsafe extern "C" fn error_message(a: *mut PJRT_Error_Message_Args) {
    // SAFETY: the PJRT contract: `args` is null or a valid args struct for this call.
    unsafe {
        enter_void("PJRT_Error_Message", a, |a| {
            let e: &Error = obj_const(a.error, "error")?;
            (a.message, a.message_size) = str_out(&e.message);
            Ok(())
        })
    }
}

entry!(error_get_code(a: PJRT_Error_GetCode_Args) {
    let e: &Error = obj_const(a.error, "error")?;
    a.code = e.code;
    Ok(())
});

// ---- plugin ---------------------------------------------------------------------------

entry!(plugin_initialize(_a: PJRT_Plugin_Initialize_Args) { Ok(()) });

entry!(plugin_attributes(a: PJRT_Plugin_Attributes_Args) {
    a.attributes = std::ptr::null();
    a.num_attributes = 0;
    Ok(())
});

// ---- events ---------------------------------------------------------------------------

entry!(event_destroy(a: PJRT_Event_Destroy_Args) {
    drop(take::<Event, _>(a.event));
    Ok(())
});

entry!(event_is_ready(a: PJRT_Event_IsReady_Args) {
    event_of(a.event)?;
    a.is_ready = true;
    Ok(())
});

entry!(event_error(a: PJRT_Event_Error_Args) {
    event_of(a.event)?.result.clone()
});

entry!(event_await(a: PJRT_Event_Await_Args) {
    event_of(a.event)?.result.clone()
});

entry!(event_on_ready(a: PJRT_Event_OnReady_Args) {
    let e = event_of(a.event)?;
    let cb = a.callback.ok_or_else(|| Error::invalid("PJRT_Event_OnReady: callback is null"))?;
    let err = match &e.result {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => e.clone().into_raw(),
    };
    // SAFETY: the caller registered `cb` with `user_arg` to be called exactly once when the
    // event is ready; ours always is, so we call it now, passing ownership of `err`.
    unsafe { cb(err, a.user_arg) };
    Ok(())
});

// ---- client ---------------------------------------------------------------------------

entry!(client_create(a: PJRT_Client_Create_Args) {
    if let Some(e) = crate::wrap::load_error() {
        return Err(Error::invalid(e));
    }
    let opts = slice(a.create_options, a.num_options, "create_options")?;
    let mut devices = None;
    let mut flags = None;
    for o in opts {
        let name = string(o.name, o.name_size, "option name")?;
        match (name.as_str(), o.type_) {
            // SAFETY: the tag says the union holds `int64_value`.
            ("num_devices", KINT64) => devices = Some(unsafe { o.__bindgen_anon_1.int64_value }),
            ("num_devices" | "peerless_flags", KSTRING) => {
                // SAFETY: the tag says the union holds `string_value` of `value_size` bytes.
                let s = string(unsafe { o.__bindgen_anon_1.string_value }, o.value_size, "option value")?;
                if name == "num_devices" {
                    devices = Some(s.trim().parse().map_err(|_| Error::invalid(format!("peerless: num_devices={s} is not an integer")))?);
                } else {
                    flags = Some(s);
                }
            }
            _ => log_ignored(&name),
        }
    }
    let config = ClientConfig::new(devices, flags.as_deref())?;
    a.client = Box::into_raw(Client::new(config)).cast();
    Ok(())
});

fn log_ignored(name: &str) {
    if std::env::var_os("PEERLESS_DEBUG").is_some() {
        eprintln!("peerless: ignoring client create option {name}");
    }
}

entry!(client_destroy(a: PJRT_Client_Destroy_Args) {
    drop(take::<Client, _>(a.client));
    Ok(())
});

entry!(client_platform_name(a: PJRT_Client_PlatformName_Args) {
    client_of(a.client)?;
    (a.platform_name, a.platform_name_size) = str_out(crate::PLATFORM_NAME);
    Ok(())
});

entry!(client_process_index(a: PJRT_Client_ProcessIndex_Args) {
    client_of(a.client)?;
    a.process_index = 0;
    Ok(())
});

entry!(client_platform_version(a: PJRT_Client_PlatformVersion_Args) {
    let c = client_of(a.client)?;
    (a.platform_version, a.platform_version_size) = str_out(&c.platform_version);
    Ok(())
});

entry!(client_devices(a: PJRT_Client_Devices_Args) {
    let c = client_of(a.client)?;
    (a.devices, a.num_devices) = (c.device_ptrs.as_ptr(), c.device_ptrs.len());
    Ok(())
});

entry!(client_addressable_devices(a: PJRT_Client_AddressableDevices_Args) {
    let c = client_of(a.client)?;
    (a.addressable_devices, a.num_addressable_devices) = (c.device_ptrs.as_ptr(), c.device_ptrs.len());
    Ok(())
});

entry!(client_lookup_device(a: PJRT_Client_LookupDevice_Args) {
    let c = client_of(a.client)?;
    a.device = c.device_ptrs[c.device_by_id(i64::from(a.id))?];
    Ok(())
});

entry!(client_lookup_addressable_device(a: PJRT_Client_LookupAddressableDevice_Args) {
    let c = client_of(a.client)?;
    a.addressable_device = c.device_ptrs[c.device_by_id(i64::from(a.local_hardware_id))?];
    Ok(())
});

entry!(client_addressable_memories(a: PJRT_Client_AddressableMemories_Args) {
    let c = client_of(a.client)?;
    (a.addressable_memories, a.num_addressable_memories) = (c.memory_ptrs.as_ptr(), c.memory_ptrs.len());
    Ok(())
});

entry!(client_compile(a: PJRT_Client_Compile_Args) {
    let c = client_of(a.client)?;
    let program: &PJRT_Program = obj_const(a.program, "program")?;
    let format = string(program.format, program.format_size, "program format")?;
    let code = slice(program.code.cast_const().cast::<u8>(), program.code_size, "program code")?;
    let options = slice(a.compile_options.cast::<u8>(), a.compile_options_size, "compile options")?;
    let compiled = Arc::new(crate::runtime::compile(c, &format, code, options)?);
    let device_ptrs = compiled.devices.iter().map(|&d| c.device_ptrs[d]).collect();
    let loaded = Loaded { compiled, client: std::ptr::from_ref(c), device_ptrs };
    a.executable = Box::into_raw(Box::new(loaded)).cast();
    Ok(())
});

entry!(client_default_device_assignment(a: PJRT_Client_DefaultDeviceAssignment_Args) {
    let c = client_of(a.client)?;
    let (r, p) = (a.num_replicas.max(0) as usize, a.num_partitions.max(0) as usize);
    let n = r * p;
    if n > c.devices.len() {
        return Err(Error::invalid(format!("peerless: {r} replicas x {p} partitions need {n} devices, the client has {}", c.devices.len())));
    }
    if a.default_assignment_size < n {
        return Err(Error::invalid(format!("peerless: default_assignment has {} slots, {n} needed", a.default_assignment_size)));
    }
    if n > 0 && a.default_assignment.is_null() {
        return Err(Error::invalid("peerless: default_assignment is null"));
    }
    for i in 0..n {
        // SAFETY: `default_assignment` holds `default_assignment_size >= n` ints (checked).
        unsafe { a.default_assignment.add(i).write(c.devices[i].id) };
    }
    Ok(())
});

entry!(client_buffer_from_host_buffer(a: PJRT_Client_BufferFromHostBuffer_Args) {
    let c = client_of(a.client)?;
    let device = if !a.device.is_null() {
        c.device_index(a.device).ok_or_else(|| Error::invalid("peerless: device is not one of this client's"))?
    } else if !a.memory.is_null() {
        c.memory_index(a.memory).ok_or_else(|| Error::invalid("peerless: memory is not one of this client's"))?
    } else {
        return Err(Error::invalid("peerless: BufferFromHostBuffer needs a device or a memory"));
    };
    if !a.device_layout.is_null() {
        return Err(Error::unimplemented("peerless: BufferFromHostBuffer with a device_layout"));
    }
    let ty = from_pjrt_type(a.type_)?;
    let dims = slice(a.dims, a.num_dims, "dims")?.to_vec();
    if dims.iter().any(|&d| d < 0) {
        return Err(Error::invalid(format!("peerless: negative dimension in {dims:?}")));
    }
    let shape = ArrayShape::new(ty, dims);
    let strides = slice(a.byte_strides, a.num_byte_strides, "byte_strides")?;
    let data = gather_host(a.data.cast(), &shape, strides)?;
    let array = hlo::Array::new(shape.clone(), data).map_err(|e| Error::internal(e.to_string()))?;
    let buffer = Buffer { client: std::ptr::from_ref(c), device, shape, data: std::sync::Mutex::new(Some(Arc::new(array))) };
    a.done_with_host_buffer = Event::ready();
    a.buffer = Box::into_raw(Box::new(buffer)).cast();
    Ok(())
});

entry!(client_topology_description(a: PJRT_Client_TopologyDescription_Args) {
    let c = client_of(a.client)?;
    a.topology = std::ptr::from_ref::<Topology>(&c.topology).cast_mut().cast();
    Ok(())
});

// ---- devices, descriptions, memories ------------------------------------------------------

entry!(device_description_id(a: PJRT_DeviceDescription_Id_Args) {
    a.id = desc_of(a.device_description)?.id;
    Ok(())
});

entry!(device_description_process_index(a: PJRT_DeviceDescription_ProcessIndex_Args) {
    desc_of(a.device_description)?;
    a.process_index = 0;
    Ok(())
});

entry!(device_description_attributes(a: PJRT_DeviceDescription_Attributes_Args) {
    desc_of(a.device_description)?;
    (a.attributes, a.num_attributes) = (std::ptr::null(), 0);
    Ok(())
});

entry!(device_description_kind(a: PJRT_DeviceDescription_Kind_Args) {
    desc_of(a.device_description)?;
    (a.device_kind, a.device_kind_size) = str_out(DEVICE_KIND);
    Ok(())
});

entry!(device_description_debug_string(a: PJRT_DeviceDescription_DebugString_Args) {
    let d = desc_of(a.device_description)?;
    (a.debug_string, a.debug_string_size) = str_out(&d.debug_string);
    Ok(())
});

entry!(device_description_to_string(a: PJRT_DeviceDescription_ToString_Args) {
    let d = desc_of(a.device_description)?;
    (a.to_string, a.to_string_size) = str_out(&d.to_string);
    Ok(())
});

entry!(device_get_description(a: PJRT_Device_GetDescription_Args) {
    device_of(a.device)?;
    a.device_description = a.device.cast();
    Ok(())
});

entry!(device_is_addressable(a: PJRT_Device_IsAddressable_Args) {
    device_of(a.device)?;
    a.is_addressable = true;
    Ok(())
});

entry!(device_local_hardware_id(a: PJRT_Device_LocalHardwareId_Args) {
    a.local_hardware_id = device_of(a.device)?.index as i32;
    Ok(())
});

entry!(device_addressable_memories(a: PJRT_Device_AddressableMemories_Args) {
    let d = device_of(a.device)?;
    (a.memories, a.num_memories) = (d.memories.as_ptr(), d.memories.len());
    Ok(())
});

entry!(device_default_memory(a: PJRT_Device_DefaultMemory_Args) {
    a.memory = device_of(a.device)?.memories[0];
    Ok(())
});

entry!(device_memory_stats(a: PJRT_Device_MemoryStats_Args) {
    device_of(a.device)?;
    a.bytes_in_use = 0;
    a.peak_bytes_in_use_is_set = false;
    a.num_allocs_is_set = false;
    a.largest_alloc_size_is_set = false;
    a.bytes_limit_is_set = false;
    a.bytes_reserved_is_set = false;
    a.peak_bytes_reserved_is_set = false;
    a.bytes_reservable_limit_is_set = false;
    a.largest_free_block_bytes_is_set = false;
    Ok(())
});

entry!(memory_id(a: PJRT_Memory_Id_Args) {
    a.id = memory_of(a.memory)?.id;
    Ok(())
});

entry!(memory_kind(a: PJRT_Memory_Kind_Args) {
    memory_of(a.memory)?;
    (a.kind, a.kind_size) = str_out(MEMORY_KIND);
    Ok(())
});

entry!(memory_kind_id(a: PJRT_Memory_Kind_Id_Args) {
    memory_of(a.memory)?;
    a.kind_id = 0;
    Ok(())
});

entry!(memory_debug_string(a: PJRT_Memory_DebugString_Args) {
    let m = memory_of(a.memory)?;
    (a.debug_string, a.debug_string_size) = str_out(&m.debug_string);
    Ok(())
});

entry!(memory_to_string(a: PJRT_Memory_ToString_Args) {
    let m = memory_of(a.memory)?;
    (a.to_string, a.to_string_size) = str_out(&m.to_string);
    Ok(())
});

entry!(memory_addressable_by_devices(a: PJRT_Memory_AddressableByDevices_Args) {
    let m = memory_of(a.memory)?;
    (a.devices, a.num_devices) = (m.devices.as_ptr(), m.devices.len());
    Ok(())
});

// ---- topology -----------------------------------------------------------------------------

entry!(topology_destroy(_a: PJRT_TopologyDescription_Destroy_Args) {
    // The only topologies we hand out are owned by their client.
    Ok(())
});

entry!(topology_platform_name(a: PJRT_TopologyDescription_PlatformName_Args) {
    obj::<Topology, _>(a.topology, "topology")?;
    (a.platform_name, a.platform_name_size) = str_out(crate::PLATFORM_NAME);
    Ok(())
});

entry!(topology_platform_version(a: PJRT_TopologyDescription_PlatformVersion_Args) {
    obj::<Topology, _>(a.topology, "topology")?;
    (a.platform_version, a.platform_version_size) = str_out(crate::PLATFORM_VERSION);
    Ok(())
});

entry!(topology_get_device_descriptions(a: PJRT_TopologyDescription_GetDeviceDescriptions_Args) {
    let t: &Topology = obj(a.topology, "topology")?;
    (a.descriptions, a.num_descriptions) = (t.descriptions.as_ptr(), t.descriptions.len());
    Ok(())
});

entry!(topology_attributes(a: PJRT_TopologyDescription_Attributes_Args) {
    obj::<Topology, _>(a.topology, "topology")?;
    (a.attributes, a.num_attributes) = (std::ptr::null(), 0);
    Ok(())
});

// ---- buffers ------------------------------------------------------------------------------

entry!(buffer_destroy(a: PJRT_Buffer_Destroy_Args) {
    drop(take::<Buffer, _>(a.buffer));
    Ok(())
});

entry!(buffer_element_type(a: PJRT_Buffer_ElementType_Args) {
    let b = buffer_of(a.buffer)?;
    a.type_ = to_pjrt_type(b.shape.ty).ok_or_else(|| Error::internal("peerless: buffer type without a PJRT type"))?;
    Ok(())
});

entry!(buffer_dimensions(a: PJRT_Buffer_Dimensions_Args) {
    let b = buffer_of(a.buffer)?;
    (a.dims, a.num_dims) = (b.shape.dims.as_ptr(), b.shape.dims.len());
    Ok(())
});

entry!(buffer_unpadded_dimensions(a: PJRT_Buffer_UnpaddedDimensions_Args) {
    let b = buffer_of(a.buffer)?;
    (a.unpadded_dims, a.num_dims) = (b.shape.dims.as_ptr(), b.shape.dims.len());
    Ok(())
});

entry!(buffer_dynamic_dimension_indices(a: PJRT_Buffer_DynamicDimensionIndices_Args) {
    buffer_of(a.buffer)?;
    (a.dynamic_dim_indices, a.num_dynamic_dims) = (std::ptr::null(), 0);
    Ok(())
});

entry!(buffer_on_device_size(a: PJRT_Buffer_OnDeviceSizeInBytes_Args) {
    a.on_device_size_in_bytes = buffer_of(a.buffer)?.shape.byte_size();
    Ok(())
});

entry!(buffer_device(a: PJRT_Buffer_Device_Args) {
    let b = buffer_of(a.buffer)?;
    a.device = buffer_client(b)?.device_ptrs[b.device];
    Ok(())
});

entry!(buffer_memory(a: PJRT_Buffer_Memory_Args) {
    let b = buffer_of(a.buffer)?;
    a.memory = buffer_client(b)?.memory_ptrs[b.device];
    Ok(())
});

entry!(buffer_delete(a: PJRT_Buffer_Delete_Args) {
    *buffer_of(a.buffer)?.data.lock().unwrap_or_else(|e| e.into_inner()) = None;
    Ok(())
});

entry!(buffer_is_deleted(a: PJRT_Buffer_IsDeleted_Args) {
    a.is_deleted = buffer_of(a.buffer)?.data.lock().unwrap_or_else(|e| e.into_inner()).is_none();
    Ok(())
});

fn copy_to(b: &Buffer, device: usize) -> *mut PJRT_Buffer {
    let data = b.data.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let copy = Buffer { client: b.client, device, shape: b.shape.clone(), data: std::sync::Mutex::new(data) };
    Box::into_raw(Box::new(copy)).cast()
}

entry!(buffer_copy_to_device(a: PJRT_Buffer_CopyToDevice_Args) {
    let b = buffer_of(a.buffer)?;
    b.array()?;
    let d = buffer_client(b)?.device_index(a.dst_device).ok_or_else(|| Error::invalid("peerless: dst_device is not one of this client's"))?;
    a.dst_buffer = copy_to(b, d);
    Ok(())
});

entry!(buffer_copy_to_memory(a: PJRT_Buffer_CopyToMemory_Args) {
    let b = buffer_of(a.buffer)?;
    b.array()?;
    let d = buffer_client(b)?.memory_index(a.dst_memory).ok_or_else(|| Error::invalid("peerless: dst_memory is not one of this client's"))?;
    a.dst_buffer = copy_to(b, d);
    Ok(())
});

fn is_row_major(layout: &PJRT_Buffer_MemoryLayout, rank: usize) -> Result<bool> {
    if layout.type_ != PJRT_Buffer_MemoryLayout_Type_PJRT_Buffer_MemoryLayout_Type_Tiled {
        return Ok(false);
    }
    // SAFETY: the tag says the union holds `tiled`.
    let tiled = unsafe { &layout.__bindgen_anon_1.tiled };
    let m2m = slice(tiled.minor_to_major, tiled.minor_to_major_size, "minor_to_major")?;
    Ok(tiled.num_tiles == 0 && m2m.len() == rank && m2m.iter().enumerate().all(|(i, &d)| d == (rank - 1 - i) as i64))
}

entry!(buffer_to_host_buffer(a: PJRT_Buffer_ToHostBuffer_Args) {
    let b = buffer_of(a.buffer_src())?;
    let array = b.array()?;
    if !a.host_layout.is_null() {
        let layout: &PJRT_Buffer_MemoryLayout = obj(a.host_layout, "host_layout")?;
        if !is_row_major(layout, b.shape.dims.len())? {
            return Err(Error::unimplemented("peerless: ToHostBuffer into a non-row-major host layout"));
        }
    }
    if a.dst.is_null() {
        a.dst_size = array.data.len();
        return Ok(());
    }
    if a.dst_size < array.data.len() {
        return Err(Error::invalid(format!("peerless: dst_size {} < buffer size {}", a.dst_size, array.data.len())));
    }
    // SAFETY: `dst` holds `dst_size >= data.len()` writable bytes (checked), not overlapping ours.
    unsafe { std::ptr::copy_nonoverlapping(array.data.as_ptr(), a.dst.cast::<u8>(), array.data.len()) };
    a.event = Event::ready();
    Ok(())
});

trait SrcBuffer {
    fn buffer_src(&self) -> *mut PJRT_Buffer;
}
impl SrcBuffer for PJRT_Buffer_ToHostBuffer_Args {
    fn buffer_src(&self) -> *mut PJRT_Buffer {
        self.src
    }
}

entry!(buffer_is_on_cpu(a: PJRT_Buffer_IsOnCpu_Args) {
    buffer_of(a.buffer)?;
    a.is_on_cpu = false;
    Ok(())
});

entry!(buffer_ready_event(a: PJRT_Buffer_ReadyEvent_Args) {
    buffer_of(a.buffer)?;
    a.event = Event::ready();
    Ok(())
});

entry!(buffer_unsafe_pointer(a: PJRT_Buffer_UnsafePointer_Args) {
    a.buffer_pointer = buffer_of(a.buffer)?.array()?.data.as_ptr() as usize;
    Ok(())
});

entry!(buffer_increase_ref(a: PJRT_Buffer_IncreaseExternalReferenceCount_Args) {
    buffer_of(a.buffer)?;
    Ok(())
});

entry!(buffer_decrease_ref(a: PJRT_Buffer_DecreaseExternalReferenceCount_Args) {
    buffer_of(a.buffer)?;
    Ok(())
});

entry!(buffer_opaque_pointer(a: PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args) {
    a.device_memory_ptr = buffer_of(a.buffer)?.array()?.data.as_ptr().cast_mut().cast::<c_void>();
    Ok(())
});

// ---- executables --------------------------------------------------------------------------

fn compiled_of<'a>(p: *mut PJRT_Executable) -> Result<&'a Compiled> {
    Ok(&exec_of(p)?.compiled)
}

entry!(executable_destroy(a: PJRT_Executable_Destroy_Args) {
    drop(take::<Executable, _>(a.executable));
    Ok(())
});

entry!(executable_name(a: PJRT_Executable_Name_Args) {
    let c = compiled_of(a.executable)?;
    (a.executable_name, a.executable_name_size) = str_out(&c.name);
    Ok(())
});

entry!(executable_num_replicas(a: PJRT_Executable_NumReplicas_Args) {
    a.num_replicas = compiled_of(a.executable)?.num_replicas;
    Ok(())
});

entry!(executable_num_partitions(a: PJRT_Executable_NumPartitions_Args) {
    a.num_partitions = compiled_of(a.executable)?.num_partitions;
    Ok(())
});

entry!(executable_num_outputs(a: PJRT_Executable_NumOutputs_Args) {
    a.num_outputs = compiled_of(a.executable)?.out_types.len();
    Ok(())
});

/// Format name of the optimized program (a serialized `HloModuleProtoWithConfig`).
const HLO_WITH_CONFIG: &str = "hlo_with_config";

// Two-phase: with `program.code` null, reports the size; then fills the caller's buffer.
entry!(executable_optimized_program(a: PJRT_Executable_OptimizedProgram_Args) {
    let c = compiled_of(a.executable)?;
    if a.program.is_null() {
        return Err(Error::invalid("peerless: OptimizedProgram: program is null"));
    }
    // SAFETY: `a.program` is non-null and points to the caller's `PJRT_Program` for this
    // call (PJRT contract).
    let p = unsafe { &mut *a.program };
    (p.format, p.format_size) = str_out(HLO_WITH_CONFIG);
    if p.code.is_null() {
        p.code_size = c.optimized.len();
        return Ok(());
    }
    if p.code_size < c.optimized.len() {
        return Err(Error::invalid(format!(
            "peerless: OptimizedProgram: code_size {} < {} bytes needed",
            p.code_size,
            c.optimized.len()
        )));
    }
    // SAFETY: `p.code` is non-null and the caller owns `p.code_size` writable bytes there
    // (checked ≥ the program's length above); the source is our own buffer, so they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(c.optimized.as_ptr(), p.code.cast::<u8>(), c.optimized.len()) };
    p.code_size = c.optimized.len();
    Ok(())
});

entry!(executable_code_size(a: PJRT_Executable_SizeOfGeneratedCodeInBytes_Args) {
    compiled_of(a.executable)?;
    a.size_in_bytes = 0;
    Ok(())
});

entry!(executable_cost_analysis(a: PJRT_Executable_GetCostAnalysis_Args) {
    compiled_of(a.executable)?;
    (a.properties, a.num_properties) = (std::ptr::null(), 0);
    Ok(())
});

entry!(executable_output_memory_kinds(a: PJRT_Executable_OutputMemoryKinds_Args) {
    let e = exec_of(a.executable)?;
    (a.num_outputs, a.memory_kinds, a.memory_kind_sizes) = (e.kinds.len(), e.kinds.as_ptr(), e.kind_sizes.as_ptr());
    Ok(())
});

entry!(executable_output_element_types(a: PJRT_Executable_OutputElementTypes_Args) {
    let c = compiled_of(a.executable)?;
    (a.output_types, a.num_output_types) = (c.out_types.as_ptr().cast_mut(), c.out_types.len());
    Ok(())
});

entry!(executable_output_dimensions(a: PJRT_Executable_OutputDimensions_Args) {
    let c = compiled_of(a.executable)?;
    (a.num_outputs, a.dims, a.dim_sizes) = (c.out_dim_sizes.len(), c.out_dims.as_ptr(), c.out_dim_sizes.as_ptr());
    Ok(())
});

entry!(executable_fingerprint(a: PJRT_Executable_Fingerprint_Args) {
    let c = compiled_of(a.executable)?;
    (a.executable_fingerprint, a.executable_fingerprint_size) = str_out(&c.fingerprint);
    Ok(())
});

entry!(loaded_destroy(a: PJRT_LoadedExecutable_Destroy_Args) {
    drop(take::<Loaded, _>(a.executable));
    Ok(())
});

entry!(loaded_get_executable(a: PJRT_LoadedExecutable_GetExecutable_Args) {
    let l = loaded_of(a.loaded_executable)?;
    a.executable = Box::into_raw(Box::new(Executable::new(l.compiled.clone()))).cast();
    Ok(())
});

entry!(loaded_addressable_devices(a: PJRT_LoadedExecutable_AddressableDevices_Args) {
    let l = loaded_of(a.executable)?;
    (a.addressable_devices, a.num_addressable_devices) = (l.device_ptrs.as_ptr(), l.device_ptrs.len());
    Ok(())
});

entry!(loaded_delete(a: PJRT_LoadedExecutable_Delete_Args) {
    loaded_of(a.executable)?.compiled.deleted.store(true, Ordering::Release);
    Ok(())
});

entry!(loaded_is_deleted(a: PJRT_LoadedExecutable_IsDeleted_Args) {
    a.is_deleted = loaded_of(a.executable)?.compiled.deleted.load(Ordering::Acquire);
    Ok(())
});

entry!(loaded_fingerprint(a: PJRT_LoadedExecutable_Fingerprint_Args) {
    let l = loaded_of(a.executable)?;
    (a.executable_fingerprint, a.executable_fingerprint_size) = str_out(&l.compiled.fingerprint);
    Ok(())
});

entry!(loaded_execute(a: PJRT_LoadedExecutable_Execute_Args) {
    let l = loaded_of(a.executable)?;
    let client: &Client = obj_const(l.client, "executable's client")?;
    let c = &l.compiled;
    if !a.execute_device.is_null() {
        let want = client.device_index(a.execute_device);
        if c.devices.len() != 1 || want != Some(c.devices[0]) {
            return Err(Error::unimplemented("peerless: portable execution (execute_device) on a device other than the compiled one"));
        }
    }
    let lists = slice(a.argument_lists, a.num_devices, "argument_lists")?;
    let mut args = Vec::with_capacity(lists.len());
    for &list in lists {
        let bufs = slice(list, a.num_args, "argument list")?;
        args.push(bufs.iter().map(|&p| buffer_of(p)).collect::<Result<Vec<_>>>()?);
    }
    // The output lists are checked before anything runs: when Execute returns an error the
    // caller reads no outputs and destroys none (PJRT contract), so a buffer written into
    // `output_lists[0]` before `output_lists[1]` turned out null would leak.
    let out_lists = slice(a.output_lists, a.num_devices, "output_lists")?;
    let num_outputs = c.out_shapes.len();
    if let Some(d) = out_lists.iter().position(|p| p.is_null()).filter(|_| num_outputs > 0) {
        return Err(Error::invalid(format!(
            "peerless: output_lists[{d}] is null, but the executable has {num_outputs} outputs per device"
        )));
    }
    let outs = c.execute(&args)?;
    if outs.len() != out_lists.len() || outs.iter().any(|row| row.len() != num_outputs) {
        return Err(Error::internal(format!(
            "peerless: execution returned {} output lists, expected {} of {num_outputs} outputs",
            outs.len(),
            out_lists.len()
        )));
    }
    // Nothing below can fail, so on every error above no output buffer and no completion
    // event has been written: a failed execution fails for every device at once, in the
    // returned error (the header: "If Execute returns an error, then
    // `device_complete_events` will not be populated").
    for (d, (row, &dst)) in outs.into_iter().zip(out_lists).enumerate() {
        for (o, array) in row.into_iter().enumerate() {
            let b = Buffer { client: l.client, device: c.devices[d], shape: array.shape.clone(), data: std::sync::Mutex::new(Some(array)) };
            // SAFETY: the caller allocates `output_lists[d]` (non-null, checked) with
            // NumOutputs slots (PJRT contract); `o < num_outputs` (checked above).
            unsafe { dst.add(o).write(Box::into_raw(Box::new(b)).cast()) };
        }
    }
    if !a.device_complete_events.is_null() {
        for d in 0..a.num_devices {
            // SAFETY: when non-null, `device_complete_events` has `num_devices` slots (PJRT contract).
            unsafe { a.device_complete_events.add(d).write(Event::ready()) };
        }
    }
    Ok(())
});

// ---- not implemented ------------------------------------------------------------------------

unimplemented_entry!(executable_serialize, PJRT_Executable_Serialize_Args, "executables are not serializable");
unimplemented_entry!(
    executable_deserialize_and_load,
    PJRT_Executable_DeserializeAndLoad_Args,
    "executables are not serializable"
);
unimplemented_entry!(
    executable_compiled_memory_stats,
    PJRT_Executable_GetCompiledMemoryStats_Args,
    "no memory statistics"
);
unimplemented_entry!(buffer_get_memory_layout, PJRT_Buffer_GetMemoryLayout_Args, "buffers are dense row-major");
unimplemented_entry!(stream_destroy, PJRT_CopyToDeviceStream_Destroy_Args, "no copy-to-device streams");
unimplemented_entry!(stream_add_chunk, PJRT_CopyToDeviceStream_AddChunk_Args, "no copy-to-device streams");
unimplemented_entry!(stream_total_bytes, PJRT_CopyToDeviceStream_TotalBytes_Args, "no copy-to-device streams");
unimplemented_entry!(stream_granule_size, PJRT_CopyToDeviceStream_GranuleSize_Args, "no copy-to-device streams");
unimplemented_entry!(stream_current_bytes, PJRT_CopyToDeviceStream_CurrentBytes_Args, "no copy-to-device streams");
unimplemented_entry!(topology_create, PJRT_TopologyDescription_Create_Args, "use the client's topology");
unimplemented_entry!(topology_serialize, PJRT_TopologyDescription_Serialize_Args, "topologies are not serializable");
unimplemented_entry!(compile_aot, PJRT_Compile_Args, "compile through a client");
unimplemented_entry!(client_create_view, PJRT_Client_CreateViewOfDeviceBuffer_Args, "no views of foreign memory");
unimplemented_entry!(execute_context_create, PJRT_ExecuteContext_Create_Args, "no execute contexts");
unimplemented_entry!(execute_context_destroy, PJRT_ExecuteContext_Destroy_Args, "no execute contexts");

/// Fills a table slot past the end of API 0.54 (see [`Table`]).
unsafe extern "C" fn beyond_054(_args: *mut c_void) -> *mut PJRT_Error {
    Error::unimplemented(format!(
        "peerless: a PJRT function newer than C API {}.{} was called",
        PJRT_API_MAJOR, PJRT_API_MINOR
    ))
    .into_raw()
}

/// Number of guard slots after the 0.54 table.
pub const GUARD_SLOTS: usize = 256;

/// The function table. `api` is the API 0.54 table whose `struct_size` the framework sees;
/// `guard` follows it so that a framework reading slots past our `struct_size` without
/// checking the version (a bug, but a common one) gets UNIMPLEMENTED instead of a jump
/// through garbage. Every PJRT function has the shape `PJRT_Error* f(Args*)`, so a guard
/// slot is ABI-compatible with whatever the framework thinks is there.
#[repr(C)]
pub struct Table {
    pub api: PJRT_Api,
    pub guard: [Option<unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error>; GUARD_SLOTS],
}

// SAFETY: the table is immutable after construction and its only pointer field
// (`extension_start`) is null; function pointers are thread-safe to share.
unsafe impl Sync for Table {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for Table {}

pub fn table() -> Table {
    Table {
        api: PJRT_Api {
            struct_size: PJRT_Api_STRUCT_SIZE as usize,
            extension_start: std::ptr::null_mut(),
            pjrt_api_version: PJRT_Api_Version {
                struct_size: PJRT_Api_Version_STRUCT_SIZE as usize,
                extension_start: std::ptr::null_mut(),
                major_version: PJRT_API_MAJOR as i32,
                minor_version: PJRT_API_MINOR as i32,
            },
            PJRT_Error_Destroy: Some(error_destroy),
            PJRT_Error_Message: Some(error_message),
            PJRT_Error_GetCode: Some(error_get_code),
            PJRT_Plugin_Initialize: Some(plugin_initialize),
            PJRT_Plugin_Attributes: Some(plugin_attributes),
            PJRT_Event_Destroy: Some(event_destroy),
            PJRT_Event_IsReady: Some(event_is_ready),
            PJRT_Event_Error: Some(event_error),
            PJRT_Event_Await: Some(event_await),
            PJRT_Event_OnReady: Some(event_on_ready),
            PJRT_Client_Create: Some(client_create),
            PJRT_Client_Destroy: Some(client_destroy),
            PJRT_Client_PlatformName: Some(client_platform_name),
            PJRT_Client_ProcessIndex: Some(client_process_index),
            PJRT_Client_PlatformVersion: Some(client_platform_version),
            PJRT_Client_Devices: Some(client_devices),
            PJRT_Client_AddressableDevices: Some(client_addressable_devices),
            PJRT_Client_LookupDevice: Some(client_lookup_device),
            PJRT_Client_LookupAddressableDevice: Some(client_lookup_addressable_device),
            PJRT_Client_AddressableMemories: Some(client_addressable_memories),
            PJRT_Client_Compile: Some(client_compile),
            PJRT_Client_DefaultDeviceAssignment: Some(client_default_device_assignment),
            PJRT_Client_BufferFromHostBuffer: Some(client_buffer_from_host_buffer),
            PJRT_DeviceDescription_Id: Some(device_description_id),
            PJRT_DeviceDescription_ProcessIndex: Some(device_description_process_index),
            PJRT_DeviceDescription_Attributes: Some(device_description_attributes),
            PJRT_DeviceDescription_Kind: Some(device_description_kind),
            PJRT_DeviceDescription_DebugString: Some(device_description_debug_string),
            PJRT_DeviceDescription_ToString: Some(device_description_to_string),
            PJRT_Device_GetDescription: Some(device_get_description),
            PJRT_Device_IsAddressable: Some(device_is_addressable),
            PJRT_Device_LocalHardwareId: Some(device_local_hardware_id),
            PJRT_Device_AddressableMemories: Some(device_addressable_memories),
            PJRT_Device_DefaultMemory: Some(device_default_memory),
            PJRT_Device_MemoryStats: Some(device_memory_stats),
            PJRT_Memory_Id: Some(memory_id),
            PJRT_Memory_Kind: Some(memory_kind),
            PJRT_Memory_DebugString: Some(memory_debug_string),
            PJRT_Memory_ToString: Some(memory_to_string),
            PJRT_Memory_AddressableByDevices: Some(memory_addressable_by_devices),
            PJRT_Executable_Destroy: Some(executable_destroy),
            PJRT_Executable_Name: Some(executable_name),
            PJRT_Executable_NumReplicas: Some(executable_num_replicas),
            PJRT_Executable_NumPartitions: Some(executable_num_partitions),
            PJRT_Executable_NumOutputs: Some(executable_num_outputs),
            PJRT_Executable_SizeOfGeneratedCodeInBytes: Some(executable_code_size),
            PJRT_Executable_GetCostAnalysis: Some(executable_cost_analysis),
            PJRT_Executable_OutputMemoryKinds: Some(executable_output_memory_kinds),
            PJRT_Executable_OptimizedProgram: Some(executable_optimized_program),
            PJRT_Executable_Serialize: Some(executable_serialize),
            PJRT_LoadedExecutable_Destroy: Some(loaded_destroy),
            PJRT_LoadedExecutable_GetExecutable: Some(loaded_get_executable),
            PJRT_LoadedExecutable_AddressableDevices: Some(loaded_addressable_devices),
            PJRT_LoadedExecutable_Delete: Some(loaded_delete),
            PJRT_LoadedExecutable_IsDeleted: Some(loaded_is_deleted),
            PJRT_LoadedExecutable_Execute: Some(loaded_execute),
            PJRT_Executable_DeserializeAndLoad: Some(executable_deserialize_and_load),
            PJRT_LoadedExecutable_Fingerprint: Some(loaded_fingerprint),
            PJRT_Buffer_Destroy: Some(buffer_destroy),
            PJRT_Buffer_ElementType: Some(buffer_element_type),
            PJRT_Buffer_Dimensions: Some(buffer_dimensions),
            PJRT_Buffer_UnpaddedDimensions: Some(buffer_unpadded_dimensions),
            PJRT_Buffer_DynamicDimensionIndices: Some(buffer_dynamic_dimension_indices),
            PJRT_Buffer_GetMemoryLayout: Some(buffer_get_memory_layout),
            PJRT_Buffer_OnDeviceSizeInBytes: Some(buffer_on_device_size),
            PJRT_Buffer_Device: Some(buffer_device),
            PJRT_Buffer_Memory: Some(buffer_memory),
            PJRT_Buffer_Delete: Some(buffer_delete),
            PJRT_Buffer_IsDeleted: Some(buffer_is_deleted),
            PJRT_Buffer_CopyToDevice: Some(buffer_copy_to_device),
            PJRT_Buffer_ToHostBuffer: Some(buffer_to_host_buffer),
            PJRT_Buffer_IsOnCpu: Some(buffer_is_on_cpu),
            PJRT_Buffer_ReadyEvent: Some(buffer_ready_event),
            PJRT_Buffer_UnsafePointer: Some(buffer_unsafe_pointer),
            PJRT_Buffer_IncreaseExternalReferenceCount: Some(buffer_increase_ref),
            PJRT_Buffer_DecreaseExternalReferenceCount: Some(buffer_decrease_ref),
            PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Some(buffer_opaque_pointer),
            PJRT_CopyToDeviceStream_Destroy: Some(stream_destroy),
            PJRT_CopyToDeviceStream_AddChunk: Some(stream_add_chunk),
            PJRT_CopyToDeviceStream_TotalBytes: Some(stream_total_bytes),
            PJRT_CopyToDeviceStream_GranuleSize: Some(stream_granule_size),
            PJRT_CopyToDeviceStream_CurrentBytes: Some(stream_current_bytes),
            PJRT_TopologyDescription_Create: Some(topology_create),
            PJRT_TopologyDescription_Destroy: Some(topology_destroy),
            PJRT_TopologyDescription_PlatformName: Some(topology_platform_name),
            PJRT_TopologyDescription_PlatformVersion: Some(topology_platform_version),
            PJRT_TopologyDescription_GetDeviceDescriptions: Some(topology_get_device_descriptions),
            PJRT_TopologyDescription_Serialize: Some(topology_serialize),
            PJRT_TopologyDescription_Attributes: Some(topology_attributes),
            PJRT_Compile: Some(compile_aot),
            PJRT_Executable_OutputElementTypes: Some(executable_output_element_types),
            PJRT_Executable_OutputDimensions: Some(executable_output_dimensions),
            PJRT_Buffer_CopyToMemory: Some(buffer_copy_to_memory),
            PJRT_Client_CreateViewOfDeviceBuffer: Some(client_create_view),
            PJRT_Executable_Fingerprint: Some(executable_fingerprint),
            PJRT_Client_TopologyDescription: Some(client_topology_description),
            PJRT_Executable_GetCompiledMemoryStats: Some(executable_compiled_memory_stats),
            PJRT_Memory_Kind_Id: Some(memory_kind_id),
            PJRT_ExecuteContext_Create: Some(execute_context_create),
            PJRT_ExecuteContext_Destroy: Some(execute_context_destroy),
        },
        guard: [Some(beyond_054); GUARD_SLOTS],
    }
}
