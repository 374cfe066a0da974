/* The PJRT C ABI under misuse, driven the way a C/C++ framework drives a plugin: dlopen the
 * library, call GetPjrtApi, and use nothing but the function table. Every documented misuse
 * must come back as a PJRT_Error (with a message), never a crash. Built and run by
 * plugin/so/tests/c_abi.rs; exits 0 and prints "misuse: N checks passed" on success.
 *
 *   misuse LIBRARY.so PROGRAM.pb
 *
 * PROGRAM.pb is hlo-tests' collective_permute_start_done (2 replicas: f32[3] x; outputs
 * (permute(x), permute(x) + exp(x))). The environment sets PEERLESS_TEST_PANIC to
 * "plugin_attributes", so that entry point panics inside the plugin (see boundary.rs). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xla/pjrt/c/pjrt_c_api.h"

static const PJRT_Api* api;
static int checks;

static void fail(const char* what, int line) {
  fprintf(stderr, "misuse.c:%d: FAILED: %s\n", line, what);
  exit(1);
}
#define CHECK(cond)                  \
  do {                               \
    checks++;                        \
    if (!(cond)) fail(#cond, __LINE__); \
  } while (0)

/* Message and code of `e`, which it destroys. Returns the code; copies the message. */
static PJRT_Error_Code take_error(PJRT_Error* e, char* msg, size_t cap) {
  PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = e};
  api->PJRT_Error_Message(&m);
  size_t n = m.message_size < cap - 1 ? m.message_size : cap - 1;
  memcpy(msg, m.message, n);
  msg[n] = 0;
  PJRT_Error_GetCode_Args c = {.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE, .error = e};
  PJRT_Error* ce = api->PJRT_Error_GetCode(&c);
  if (ce != NULL) fail("PJRT_Error_GetCode failed", __LINE__);
  PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = e};
  api->PJRT_Error_Destroy(&d);
  return c.code;
}

/* `e` must be an error whose message contains `needle` (NULL: any non-empty message). */
static void expect_error(PJRT_Error* e, const char* needle, int line) {
  char msg[1024];
  checks++;
  if (e == NULL) fail("expected a PJRT_Error, got success", line);
  take_error(e, msg, sizeof msg);
  if (msg[0] == 0) fail("error without a message", line);
  if (needle != NULL && strstr(msg, needle) == NULL) {
    fprintf(stderr, "message: %s\n", msg);
    fail(needle, line);
  }
}
#define EXPECT_ERROR(call, needle) expect_error((call), (needle), __LINE__)

static void expect_ok(PJRT_Error* e, int line) {
  char msg[1024];
  checks++;
  if (e != NULL) {
    take_error(e, msg, sizeof msg);
    fprintf(stderr, "unexpected error: %s\n", msg);
    fail("expected success", line);
  }
}
#define EXPECT_OK(call) expect_ok((call), __LINE__)

typedef PJRT_Error* (*entry_fn)(void*);

/* The function-table slots after the version field, in order. */
static entry_fn slot(size_t i) {
  const char* base = (const char*)api + offsetof(PJRT_Api, PJRT_Error_Destroy);
  entry_fn f;
  memcpy(&f, base + i * sizeof(void*), sizeof f);
  return f;
}

static PJRT_Buffer* upload(PJRT_Client* client, PJRT_Device* device, PJRT_Buffer_Type type, const void* data,
                           const int64_t* dims, size_t num_dims) {
  PJRT_Client_BufferFromHostBuffer_Args b = {.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE};
  b.client = client;
  b.data = data;
  b.type = type;
  b.dims = dims;
  b.num_dims = num_dims;
  b.device = device;
  EXPECT_OK(api->PJRT_Client_BufferFromHostBuffer(&b));
  PJRT_Event_Destroy_Args ed = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = b.done_with_host_buffer};
  EXPECT_OK(api->PJRT_Event_Destroy(&ed));
  return b.buffer;
}

static void destroy_buffer(PJRT_Buffer* b) {
  PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE, .buffer = b};
  EXPECT_OK(api->PJRT_Buffer_Destroy(&d));
}

static char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) fail(path, __LINE__);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* data = malloc((size_t)n);
  if (fread(data, 1, (size_t)n, f) != (size_t)n) fail("short read", __LINE__);
  fclose(f);
  *size = (size_t)n;
  return data;
}

/* CompileOptionsProto{executable_build_options{num_replicas: 2}} */
static const char kTwoReplicas[] = {0x1a, 0x02, 0x20, 0x02};

static PJRT_Error* compile(PJRT_Client* client, const char* format, const char* code, size_t code_size,
                           PJRT_LoadedExecutable** out) {
  PJRT_Program p = {.struct_size = PJRT_Program_STRUCT_SIZE};
  p.code = (char*)code;
  p.code_size = code_size;
  p.format = format;
  p.format_size = strlen(format);
  PJRT_Client_Compile_Args c = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE};
  c.client = client;
  c.program = &p;
  c.compile_options = kTwoReplicas;
  c.compile_options_size = sizeof kTwoReplicas;
  PJRT_Error* e = api->PJRT_Client_Compile(&c);
  *out = c.executable;
  return e;
}

/* Execute `exe` on 2 devices with `args[d][0..num_args]`; outputs into out[d][0..2]. */
static PJRT_Error* execute(PJRT_LoadedExecutable* exe, PJRT_Buffer* args[2][2], size_t num_devices, size_t num_args,
                           PJRT_Buffer* out[2][2], PJRT_Event* events[2]) {
  PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE};
  PJRT_Buffer* const* lists[2] = {args[0], args[1]};
  PJRT_Buffer** outs[2] = {out[0], out[1]};
  PJRT_LoadedExecutable_Execute_Args x = {.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE};
  x.executable = exe;
  x.options = &opts;
  x.argument_lists = lists;
  x.num_devices = num_devices;
  x.num_args = num_args;
  x.output_lists = outs;
  x.device_complete_events = events;
  return api->PJRT_LoadedExecutable_Execute(&x);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: misuse LIBRARY.so PROGRAM.pb\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const PJRT_Api* (*get_api)(void) = (const PJRT_Api* (*)(void))dlsym(lib, "GetPjrtApi");
  CHECK(get_api != NULL);
  api = get_api();
  CHECK(api != NULL);
  CHECK(api->struct_size >= PJRT_Api_STRUCT_SIZE);

  /* 1. No slot is null. Slots 0 and 1 (Error_Destroy, Error_Message) return void. */
  size_t slots = (api->struct_size - offsetof(PJRT_Api, PJRT_Error_Destroy)) / sizeof(void*);
  for (size_t i = 0; i < slots; i++) CHECK(slot(i) != NULL);

  /* 2. Null args and a too-small struct_size, for every slot that returns an error. */
  for (size_t i = 2; i < slots; i++) {
    EXPECT_ERROR(slot(i)(NULL), NULL);
    size_t small[64];
    memset(small, 0, sizeof small);
    small[0] = sizeof(size_t); /* struct_size: only itself */
    EXPECT_ERROR(slot(i)(small), NULL);
  }
  {
    PJRT_Client_Create_Args c = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE - 1};
    EXPECT_ERROR(api->PJRT_Client_Create(&c), "struct_size");
  }
  /* The void entry points tolerate null args and null errors. */
  api->PJRT_Error_Destroy(NULL);
  api->PJRT_Error_Message(NULL);
  {
    PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = NULL};
    api->PJRT_Error_Destroy(&d);
    PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = NULL};
    api->PJRT_Error_Message(&m);
  }

  /* 3. A panic inside an entry point comes back as INTERNAL (PEERLESS_TEST_PANIC). */
  {
    PJRT_Plugin_Attributes_Args a = {.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE};
    PJRT_Error* e = api->PJRT_Plugin_Attributes(&a);
    CHECK(e != NULL);
    char msg[1024];
    CHECK(take_error(e, msg, sizeof msg) == PJRT_Error_Code_INTERNAL);
    CHECK(strstr(msg, "panic") != NULL);
  }

  /* A client with 2 devices. */
  PJRT_NamedValue opt = {.struct_size = PJRT_NamedValue_STRUCT_SIZE};
  opt.name = "num_devices";
  opt.name_size = strlen(opt.name);
  opt.type = PJRT_NamedValue_kInt64;
  opt.int64_value = 2;
  PJRT_Client_Create_Args cc = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE};
  cc.create_options = &opt;
  cc.num_options = 1;
  EXPECT_OK(api->PJRT_Client_Create(&cc));
  PJRT_Client* client = cc.client;
  PJRT_Client_Devices_Args da = {.struct_size = PJRT_Client_Devices_Args_STRUCT_SIZE, .client = client};
  EXPECT_OK(api->PJRT_Client_Devices(&da));
  CHECK(da.num_devices == 2);
  PJRT_Device* dev[2] = {da.devices[0], da.devices[1]};
  {
    PJRT_Client_LookupDevice_Args l = {.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE, .client = client};
    l.id = 7;
    EXPECT_ERROR(api->PJRT_Client_LookupDevice(&l), "no device");
    l.id = -1;
    EXPECT_ERROR(api->PJRT_Client_LookupDevice(&l), "no device");
    PJRT_Client_DefaultDeviceAssignment_Args a = {.struct_size = PJRT_Client_DefaultDeviceAssignment_Args_STRUCT_SIZE};
    a.client = client;
    a.num_replicas = 1 << 30;
    a.num_partitions = 1 << 30;
    EXPECT_ERROR(api->PJRT_Client_DefaultDeviceAssignment(&a), NULL);
    a.num_replicas = 2;
    a.num_partitions = 1;
    a.default_assignment_size = 2;
    EXPECT_ERROR(api->PJRT_Client_DefaultDeviceAssignment(&a), "null");
  }

  /* 4. Programs: null program, unknown format, garbage bytes, empty code. */
  size_t pb_size;
  char* pb = read_file(argv[2], &pb_size);
  PJRT_LoadedExecutable* exe = NULL;
  {
    PJRT_Client_Compile_Args c = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE, .client = client};
    EXPECT_ERROR(api->PJRT_Client_Compile(&c), "program is null");
    EXPECT_ERROR(compile(client, "stablehlo-bytecode", pb, pb_size, &exe), "unsupported program format");
    EXPECT_ERROR(compile(client, "hlo", "\xff\xff\xff\xff garbage", 13, &exe), NULL);
    EXPECT_ERROR(compile(client, "hlo", NULL, 0, &exe), NULL);
    EXPECT_ERROR(compile(client, "hlo", NULL, 16, &exe), "null");
    EXPECT_ERROR(compile(client, "hlo_with_config", pb, pb_size, &exe), NULL);
  }
  EXPECT_OK(compile(client, "hlo", pb, pb_size, &exe));
  CHECK(exe != NULL);

  /* Arguments: x on each device, plus wrong shape, wrong dtype. */
  const float x0[3] = {1, 2, 3}, x1[3] = {4, 5, 6};
  const float x4[4] = {1, 2, 3, 4};
  const int32_t i3[3] = {1, 2, 3};
  const int64_t d3[1] = {3}, d4[1] = {4};
  PJRT_Buffer* a0 = upload(client, dev[0], PJRT_Buffer_Type_F32, x0, d3, 1);
  PJRT_Buffer* a1 = upload(client, dev[1], PJRT_Buffer_Type_F32, x1, d3, 1);
  PJRT_Buffer* wrong_shape = upload(client, dev[1], PJRT_Buffer_Type_F32, x4, d4, 1);
  PJRT_Buffer* wrong_type = upload(client, dev[1], PJRT_Buffer_Type_S32, i3, d3, 1);
  {
    /* Bad uploads. */
    PJRT_Client_BufferFromHostBuffer_Args b = {.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE};
    b.client = client;
    b.data = x0;
    b.type = PJRT_Buffer_Type_F32;
    b.dims = d3;
    b.num_dims = 1;
    EXPECT_ERROR(api->PJRT_Client_BufferFromHostBuffer(&b), "device or a memory");
    b.device = dev[0];
    b.type = (PJRT_Buffer_Type)9999;
    EXPECT_ERROR(api->PJRT_Client_BufferFromHostBuffer(&b), "type");
    b.type = PJRT_Buffer_Type_F32;
    const int64_t neg[1] = {-5};
    b.dims = neg;
    EXPECT_ERROR(api->PJRT_Client_BufferFromHostBuffer(&b), "negative");
    b.dims = NULL;
    EXPECT_ERROR(api->PJRT_Client_BufferFromHostBuffer(&b), "null");
    b.dims = d3;
    b.data = NULL;
    EXPECT_ERROR(api->PJRT_Client_BufferFromHostBuffer(&b), "null");
    b.data = x0;
    b.device = (PJRT_Device*)&b; /* not one of the client's devices */
    EXPECT_ERROR(api->PJRT_Client_BufferFromHostBuffer(&b), "not one of this client's");
  }

  /* 5. Execute with wrong argument count, shape, dtype, device, device count, null lists. */
  PJRT_Buffer* out[2][2] = {{NULL, NULL}, {NULL, NULL}};
  PJRT_Event* events[2] = {NULL, NULL};
  {
    PJRT_Buffer* args[2][2] = {{a0, a0}, {a1, a1}};
    EXPECT_ERROR(execute(exe, args, 2, 0, out, events), "argument");
    EXPECT_ERROR(execute(exe, args, 2, 2, out, events), "argument");
    EXPECT_ERROR(execute(exe, args, 1, 1, out, events), "argument lists");
    PJRT_Buffer* shape[2][2] = {{a0, NULL}, {wrong_shape, NULL}};
    EXPECT_ERROR(execute(exe, shape, 2, 1, out, events), NULL);
    PJRT_Buffer* type[2][2] = {{a0, NULL}, {wrong_type, NULL}};
    EXPECT_ERROR(execute(exe, type, 2, 1, out, events), NULL);
    PJRT_Buffer* swapped[2][2] = {{a1, NULL}, {a0, NULL}};
    EXPECT_ERROR(execute(exe, swapped, 2, 1, out, events), "lives on device");
    PJRT_Buffer* null_arg[2][2] = {{a0, NULL}, {NULL, NULL}};
    EXPECT_ERROR(execute(exe, null_arg, 2, 1, out, events), "buffer is null");
    PJRT_LoadedExecutable_Execute_Args x = {.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE};
    x.executable = exe;
    x.num_devices = 2;
    x.num_args = 1;
    EXPECT_ERROR(api->PJRT_LoadedExecutable_Execute(&x), "null");
    CHECK(out[0][0] == NULL && out[1][0] == NULL && events[0] == NULL);

    /* Valid arguments but a null output list (the whole array, device 1's, device 0's): an
     * error before anything runs, and nothing written into the other device's list or the
     * events. On an error the caller destroys no outputs, so a buffer written there would
     * leak (valgrind: section 2 of docs/RELIABILITY.md). */
    PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE};
    PJRT_Buffer* ok_args[2][2] = {{a0, NULL}, {a1, NULL}};
    PJRT_Buffer* const* lists[2] = {ok_args[0], ok_args[1]};
    PJRT_Buffer* row[2] = {NULL, NULL};
    PJRT_Event* ev[2] = {NULL, NULL};
    x.options = &opts;
    x.argument_lists = lists;
    x.device_complete_events = ev;
    x.output_lists = NULL;
    EXPECT_ERROR(api->PJRT_LoadedExecutable_Execute(&x), "output_lists is null");
    PJRT_Buffer** second_null[2] = {row, NULL};
    x.output_lists = second_null;
    EXPECT_ERROR(api->PJRT_LoadedExecutable_Execute(&x), "output_lists[1] is null");
    CHECK(row[0] == NULL && row[1] == NULL && ev[0] == NULL && ev[1] == NULL);
    PJRT_Buffer** first_null[2] = {NULL, row};
    x.output_lists = first_null;
    EXPECT_ERROR(api->PJRT_LoadedExecutable_Execute(&x), "output_lists[0] is null");
    CHECK(row[0] == NULL && row[1] == NULL && ev[0] == NULL && ev[1] == NULL);
  }

  /* A correct execution after all that: device 0 receives device 1's x. */
  {
    PJRT_Buffer* args[2][2] = {{a0, NULL}, {a1, NULL}};
    EXPECT_OK(execute(exe, args, 2, 1, out, events));
    float got[3] = {0, 0, 0};
    PJRT_Buffer_ToHostBuffer_Args t = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE};
    t.src = out[0][0];
    t.dst = got;
    t.dst_size = 2; /* too small */
    EXPECT_ERROR(api->PJRT_Buffer_ToHostBuffer(&t), "dst_size");
    t.dst_size = sizeof got;
    EXPECT_OK(api->PJRT_Buffer_ToHostBuffer(&t));
    CHECK(got[0] == 4 && got[1] == 5 && got[2] == 6);
    PJRT_Event_Destroy_Args ed = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = t.event};
    EXPECT_OK(api->PJRT_Event_Destroy(&ed));
    for (int d = 0; d < 2; d++) {
      PJRT_Event_Await_Args w = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = events[d]};
      EXPECT_OK(api->PJRT_Event_Await(&w));
      ed.event = events[d];
      EXPECT_OK(api->PJRT_Event_Destroy(&ed));
    }
  }

  /* 6. Use after delete: a deleted buffer cannot be read, executed or transferred. */
  {
    PJRT_Buffer_Delete_Args del = {.struct_size = PJRT_Buffer_Delete_Args_STRUCT_SIZE, .buffer = a1};
    EXPECT_OK(api->PJRT_Buffer_Delete(&del));
    EXPECT_OK(api->PJRT_Buffer_Delete(&del)); /* deleting twice is allowed */
    PJRT_Buffer_IsDeleted_Args isd = {.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE, .buffer = a1};
    EXPECT_OK(api->PJRT_Buffer_IsDeleted(&isd));
    CHECK(isd.is_deleted);
    float got[3];
    PJRT_Buffer_ToHostBuffer_Args t = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE};
    t.src = a1;
    t.dst = got;
    t.dst_size = sizeof got;
    EXPECT_ERROR(api->PJRT_Buffer_ToHostBuffer(&t), "deleted");
    PJRT_Buffer_CopyToDevice_Args cp = {.struct_size = PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE};
    cp.buffer = a1;
    cp.dst_device = dev[0];
    EXPECT_ERROR(api->PJRT_Buffer_CopyToDevice(&cp), "deleted");
    CHECK(cp.dst_buffer == NULL);
    PJRT_Buffer_CopyToMemory_Args cm = {.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE};
    cm.buffer = a1;
    EXPECT_ERROR(api->PJRT_Buffer_CopyToMemory(&cm), "deleted");
    PJRT_Buffer_UnsafePointer_Args up = {.struct_size = PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE, .buffer = a1};
    EXPECT_ERROR(api->PJRT_Buffer_UnsafePointer(&up), "deleted");
    PJRT_Buffer* args[2][2] = {{a0, NULL}, {a1, NULL}};
    PJRT_Buffer* none[2][2] = {{NULL, NULL}, {NULL, NULL}};
    EXPECT_ERROR(execute(exe, args, 2, 1, none, NULL), "deleted");
    /* A copy to a device that is not the client's. */
    cp.buffer = a0;
    cp.dst_device = (PJRT_Device*)&cp;
    EXPECT_ERROR(api->PJRT_Buffer_CopyToDevice(&cp), "not one of this client's");
  }

  /* 7. A deleted executable refuses to run; its views stay queryable. */
  PJRT_LoadedExecutable_GetExecutable_Args ge = {.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE};
  ge.loaded_executable = exe;
  EXPECT_OK(api->PJRT_LoadedExecutable_GetExecutable(&ge));
  {
    PJRT_LoadedExecutable_Delete_Args del = {.struct_size = PJRT_LoadedExecutable_Delete_Args_STRUCT_SIZE,
                                             .executable = exe};
    EXPECT_OK(api->PJRT_LoadedExecutable_Delete(&del));
    PJRT_Buffer* a1b = upload(client, dev[1], PJRT_Buffer_Type_F32, x1, d3, 1);
    PJRT_Buffer* args[2][2] = {{a0, NULL}, {a1b, NULL}};
    PJRT_Buffer* none[2][2] = {{NULL, NULL}, {NULL, NULL}};
    EXPECT_ERROR(execute(exe, args, 2, 1, none, NULL), "deleted");
    destroy_buffer(a1b);
  }

  /* 8. Unusual destruction order: the client first, then the loaded executable, then the
   * executable view it handed out, then buffers (inputs and outputs). */
  PJRT_Client_Destroy_Args cd = {.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE, .client = client};
  EXPECT_OK(api->PJRT_Client_Destroy(&cd));
  PJRT_LoadedExecutable_Destroy_Args ld = {.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE,
                                           .executable = exe};
  EXPECT_OK(api->PJRT_LoadedExecutable_Destroy(&ld));
  {
    PJRT_Executable_NumOutputs_Args no = {.struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE,
                                          .executable = ge.executable};
    EXPECT_OK(api->PJRT_Executable_NumOutputs(&no));
    CHECK(no.num_outputs == 2);
    PJRT_Executable_Destroy_Args ed = {.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE,
                                       .executable = ge.executable};
    EXPECT_OK(api->PJRT_Executable_Destroy(&ed));
  }
  for (int d = 0; d < 2; d++)
    for (int o = 0; o < 2; o++) destroy_buffer(out[d][o]);
  destroy_buffer(a0);
  destroy_buffer(a1);
  destroy_buffer(wrong_shape);
  destroy_buffer(wrong_type);
  /* Destroying null handles is a no-op, not a crash. */
  destroy_buffer(NULL);
  free(pb);

  printf("misuse: %d checks passed\n", checks);
  return 0;
}
