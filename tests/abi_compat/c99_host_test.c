/* A C99 host (-pedantic) that sets every struct_size from the header's macros, as the
 * header tells hosts to, and checks that the fields those macros claim to cover are read:
 * QLINK_COPY_WAIT on a copy and a broadcast over the fault backend's slow streams (the
 * destinations hold the data when the call returns, before any synchronize), and the
 * all-reduce `algorithm` (halving-doubling refused for three buffers). The older named
 * sizes still work and leave the newer fields unread. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c99 */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plugin_api/qlink.h"

static int failures = 0;

#define CHECK(cond, what)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "FAILED: %s (line %d)\n", what, __LINE__); \
      ++failures;                                                \
    }                                                            \
  } while (0)

static const char* runfile(const char* name, char* buf, size_t cap) {
  const char* root = getenv("TEST_SRCDIR");
  snprintf(buf, cap, "%s/qlink/%s", root != NULL ? root : ".", name);
  return buf;
}

static DLTensor bytes_on(void* data, int64_t* shape, int device) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = device;
  t.ndim = 1;
  t.dtype.code = kDLUInt;
  t.dtype.bits = 8;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

enum { kBytes = 4096 };

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(void) {
  char lib_path[4096], fault_path[4096], config[8192];
  void* lib = dlopen(runfile("libqlink.so", lib_path, sizeof(lib_path)), RTLD_NOW | RTLD_LOCAL);
  qlink_get_api_fn get_api;
  const qlink_api* api;
  qlink_context* ctx = NULL;
  static unsigned char src[kBytes], one[kBytes], two[kBytes];
  int64_t shape[1] = {kBytes};
  DLTensor s, d1, d2, replicas[2];
  qlink_copy_args copy;
  qlink_broadcast_args bcast;
  size_t i;
  double start_ms;

  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  *(void**)(&get_api) = dlsym(lib, "qlink_get_api");
  api = get_api(QLINK_ABI_MAJOR, QLINK_ABI_MINOR, NULL);
  if (api == NULL) return 1;
  /* Device 0 fast, devices 1 and 2 run their streams 300 ms late. */
  snprintf(config, sizeof(config),
           "{\"backend\": \"%s\", \"log_level\": \"off\", \"backend_options\": "
           "{\"devices\": 3, \"stream_delay_ms\": [0, 300, 300]}}",
           runfile("libqlink_backend_fault.so", fault_path, sizeof(fault_path)));
  if (api->context_create(config, &ctx) != QLINK_OK) {
    fprintf(stderr, "context_create: %s\n", api->last_error());
    return 1;
  }
  for (i = 0; i < kBytes; ++i) src[i] = (unsigned char)(i * 7 + 1);
  s = bytes_on(src, shape, 0);
  d1 = bytes_on(one, shape, 1);
  d2 = bytes_on(two, shape, 2);
  replicas[0] = d1;
  replicas[1] = d2;

  /* The current macro covers flags: the call waits for the slow destination stream. */
  memset(&copy, 0, sizeof(copy));
  copy.struct_size = QLINK_COPY_ARGS_STRUCT_SIZE;
  copy.sources = &s;
  copy.destinations = &d1;
  copy.num_leaves = 1;
  copy.flags = QLINK_COPY_WAIT;
  CHECK(api->copy_batch(ctx, &copy) == QLINK_OK, "copy_batch with QLINK_COPY_WAIT");
  CHECK(memcmp(one, src, kBytes) == 0, "QLINK_COPY_WAIT set through QLINK_COPY_ARGS_STRUCT_SIZE: data there on return");

  memset(&bcast, 0, sizeof(bcast));
  bcast.struct_size = QLINK_BROADCAST_ARGS_STRUCT_SIZE;
  bcast.sources = &s;
  bcast.num_leaves = 1;
  bcast.destinations = replicas;
  bcast.num_replicas = 2;
  bcast.flags = QLINK_COPY_WAIT;
  memset(one, 0, kBytes);
  CHECK(api->broadcast(ctx, &bcast) == QLINK_OK, "broadcast with QLINK_COPY_WAIT");
  CHECK(memcmp(one, src, kBytes) == 0 && memcmp(two, src, kBytes) == 0,
        "QLINK_COPY_WAIT set through QLINK_BROADCAST_ARGS_STRUCT_SIZE: every replica written on return");

  /* A 1.0-sized struct: flags is past its end and never read, so the call returns without
   * waiting for device 1's stream, 300 ms late. Timed, not read: the destination is the
   * backend worker's to write until the synchronize. */
  memset(one, 0, kBytes);
  copy.struct_size = QLINK_COPY_ARGS_STRUCT_SIZE_1_0;
  start_ms = now_ms();
  CHECK(api->copy_batch(ctx, &copy) == QLINK_OK, "copy_batch with the 1.0 size");
  CHECK(now_ms() - start_ms < 300, "a 1.0-sized copy_args had its flags read (the call waited)");
  CHECK(api->stream_synchronize(ctx, 1, NULL) == QLINK_OK, "stream_synchronize");
  CHECK(memcmp(one, src, kBytes) == 0, "the 1.0-sized copy arrived");

  {
    /* algorithm is covered by the current macro: halving-doubling needs a power-of-two
     * world, so three buffers are refused naming the field; the 1.1 size leaves it
     * unread (auto) and succeeds. */
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {1, 2, 3, 4};
    int64_t fshape[1] = {4};
    DLTensor bufs[3];
    qlink_all_reduce_args ar;
    bufs[0] = bytes_on(a, fshape, 0);
    bufs[1] = bytes_on(b, fshape, 1);
    bufs[2] = bytes_on(c, fshape, 2);
    for (i = 0; i < 3; ++i) {
      bufs[i].dtype.code = kDLFloat;
      bufs[i].dtype.bits = 32;
    }
    memset(&ar, 0, sizeof(ar));
    ar.struct_size = QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE;
    ar.buffers = bufs;
    ar.num_buffers = 3;
    ar.op = QLINK_REDUCE_SUM;
    ar.algorithm = QLINK_ALL_REDUCE_HALVING_DOUBLING;
    CHECK(api->all_reduce(ctx, &ar) == QLINK_INVALID_ARGUMENT,
          "algorithm set through QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE was not read");
    CHECK(strstr(api->last_error(), "algorithm") != NULL, "the refusal names algorithm");
    ar.struct_size = QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE_1_1;
    CHECK(api->all_reduce(ctx, &ar) == QLINK_OK, "all_reduce with the 1.1 size");
    for (i = 0; i < 3; ++i) CHECK(api->stream_synchronize(ctx, (int32_t)i, NULL) == QLINK_OK, "stream_synchronize");
    CHECK(a[3] == 12.0f && b[3] == 12.0f && c[3] == 12.0f, "the 1.1-sized all-reduce summed");
  }

  api->context_destroy(ctx);
  dlclose(lib);
  printf("%s\n", failures == 0 ? "PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
