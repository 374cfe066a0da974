/* The PJRT C ABI of libpeerless_pjrt.so where no XLA plugin can be wrapped, driven the way a
 * C/C++ framework drives a plugin: dlopen the library, call GetPjrtApi, use nothing but the
 * function table. XLA is the only runtime, so the table must still be whole (no slot within
 * struct_size is null), plugin initialisation must succeed, and every other entry point, client
 * creation first, must return a PJRT_Error whose message says what to install (or why the
 * named plugin cannot be used): never a crash, never a second runtime. Built and run by
 * plugin/so/tests/c_abi.rs; exits 0 and prints "no_plugin: N checks passed" on success.
 *
 *   no_plugin LIBRARY.so NEEDLE
 *
 * NEEDLE: a substring every error message must contain. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xla/pjrt/c/pjrt_c_api.h"

static const PJRT_Api* api;
static int checks;

static void fail(const char* what, int line) {
  fprintf(stderr, "no_plugin.c:%d: FAILED: %s\n", line, what);
  exit(1);
}
#define CHECK(cond)                     \
  do {                                  \
    checks++;                           \
    if (!(cond)) fail(#cond, __LINE__); \
  } while (0)

/* `e` must be an error with `needle` in its message and code FAILED_PRECONDITION; destroys it. */
static void expect_error(PJRT_Error* e, const char* needle, int line) {
  checks++;
  if (e == NULL) fail("expected a PJRT_Error, got success", line);
  PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = e};
  api->PJRT_Error_Message(&m);
  char msg[2048];
  size_t n = m.message_size < sizeof msg - 1 ? m.message_size : sizeof msg - 1;
  memcpy(msg, m.message, n);
  msg[n] = 0;
  if (strstr(msg, needle) == NULL) {
    fprintf(stderr, "message: %s\n", msg);
    fail("error message lacks the expected text", line);
  }
  PJRT_Error_GetCode_Args c = {.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE, .error = e};
  if (api->PJRT_Error_GetCode(&c) != NULL) fail("PJRT_Error_GetCode failed", line);
  if (c.code != PJRT_Error_Code_FAILED_PRECONDITION) fail("code is not FAILED_PRECONDITION", line);
  PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = e};
  api->PJRT_Error_Destroy(&d);
}

typedef PJRT_Error* (*Entry)(void*);

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: no_plugin LIBRARY.so NEEDLE\n");
    return 2;
  }
  const char* needle = argv[2];
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const PJRT_Api* (*get)(void) = (const PJRT_Api* (*)(void))dlsym(lib, "GetPjrtApi");
  CHECK(get != NULL);
  api = get();
  CHECK(api != NULL);
  CHECK(get() == api); /* one table for the process */
  CHECK(api->pjrt_api_version.major_version == 0 && api->pjrt_api_version.minor_version > 0);
  /* Every function slot within the table's size is set. */
  size_t header = offsetof(PJRT_Api, PJRT_Error_Destroy);
  CHECK(api->struct_size > header);
  size_t slots = (api->struct_size - header) / sizeof(void*);
  const char* base = (const char*)api + header;
  for (size_t i = 0; i < slots; i++) {
    void* f;
    memcpy(&f, base + i * sizeof(void*), sizeof f);
    CHECK(f != NULL);
  }
  /* Initialisation succeeds, attributes are none: a framework can register the platform. */
  PJRT_Plugin_Initialize_Args init = {.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
  CHECK(api->PJRT_Plugin_Initialize(&init) == NULL);
  PJRT_Plugin_Attributes_Args attrs = {.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE};
  CHECK(api->PJRT_Plugin_Attributes(&attrs) == NULL);
  CHECK(attrs.num_attributes == 0);
  /* Client creation fails with what to install, whatever its args. */
  PJRT_Client_Create_Args create = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE};
  expect_error(api->PJRT_Client_Create(&create), needle, __LINE__);
  CHECK(create.client == NULL);
  expect_error(api->PJRT_Client_Create(NULL), needle, __LINE__);
  PJRT_Client_Create_Args small = {.struct_size = 8};
  expect_error(api->PJRT_Client_Create(&small), needle, __LINE__);
  /* Every other slot of the uniform `PJRT_Error* f(Args*)` shape (all after the error
   * accessors, initialisation and attributes), on null args: an error, never a crash. */
  const void* skip[] = {(const void*)api->PJRT_Error_Destroy, (const void*)api->PJRT_Error_Message,
                        (const void*)api->PJRT_Error_GetCode, (const void*)api->PJRT_Plugin_Initialize,
                        (const void*)api->PJRT_Plugin_Attributes};
  for (size_t i = 0; i < slots; i++) {
    Entry f;
    memcpy(&f, base + i * sizeof(void*), sizeof f);
    int skipped = 0;
    for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++) skipped |= (const void*)f == skip[k];
    if (skipped) continue;
    PJRT_Error* e = f(NULL);
    if (e == NULL) continue; /* the error payload iterator: nothing to iterate */
    expect_error(e, needle, __LINE__);
  }
  printf("no_plugin: %d checks passed\n", checks);
  return 0;
}
