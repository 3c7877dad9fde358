// libFuzzer target: the C ABI fed random DLTensor descriptors (shapes, strides, dtypes,
// devices, NULL pointers, byte offsets) and stream lists, on the CPU backend loaded from
// the runfiles. Every data pointer stays inside a harness-owned arena, and a descriptor
// is never larger than the memory behind it unless its size is invalid anyway (negative
// or overflowing 64 bits), so any crash or sanitizer report is qlink's own. Oracles:
// an accepted batch leaves each destination equal to its source; a refused one writes
// nothing.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "plugin_api/qlink.h"
#include "tests/host/runfiles.h"

namespace {

constexpr size_t kArenaBytes = 1 << 16;
constexpr int kDevices = 4;
constexpr size_t kMaxLeaves = 8;

const qlink_api* api = nullptr;
qlink_context* ctx = nullptr;
alignas(64) uint8_t arena[kArenaBytes];
uint8_t before[kArenaBytes];

void Require(bool holds) {
  if (!holds) __builtin_trap();
}

// One descriptor, owning its shape and strides.
struct Leaf {
  DLTensor dl{};
  std::vector<int64_t> shape, strides;
  uint64_t bytes = 0;  // what the descriptor claims, when valid
  bool valid_size = true;
};

int64_t Dim(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return -in.ConsumeIntegralInRange<int64_t>(1, INT64_MAX);
    case 1:
      return in.ConsumeIntegralInRange<int64_t>(int64_t{1} << 32, INT64_MAX);
    default:
      return in.ConsumeIntegralInRange<int64_t>(0, 16);
  }
}

DLDevice Device(FuzzedDataProvider& in) {
  const bool odd = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  const int type = odd ? in.ConsumeIntegral<int8_t>() : kDLCPU;
  const int id = odd ? in.ConsumeIntegral<int32_t>() : in.ConsumeIntegralInRange<int>(0, kDevices - 1);
  return DLDevice{static_cast<DLDeviceType>(type), id};
}

// The true byte size (element count times element size), or !valid_size when a
// dimension is negative or the size needs more than 64 bits. Any zero dimension makes
// the size 0 whatever the others are.
void Measure(Leaf* leaf) {
  leaf->valid_size = true;
  leaf->bytes = 0;
  bool empty = false;
  for (int64_t d : leaf->shape) {
    if (d < 0) {
      leaf->valid_size = false;
      return;
    }
    empty = empty || d == 0;
  }
  if (empty) return;
  uint64_t n = leaf->dl.dtype.bits * uint64_t{leaf->dl.dtype.lanes} / 8;
  for (int64_t d : leaf->shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      leaf->valid_size = false;
      return;
    }
  }
  leaf->bytes = n;
}

void Fill(FuzzedDataProvider& in, Leaf* leaf) {
  const int ndim = in.ConsumeIntegralInRange<int>(0, 4);
  for (int d = 0; d < ndim; ++d) leaf->shape.push_back(Dim(in));
  if (in.ConsumeBool()) {
    int64_t compact = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      leaf->strides.insert(leaf->strides.begin(), in.ConsumeBool() ? compact : in.ConsumeIntegral<int64_t>());
      if (leaf->shape[d] > 0 && leaf->shape[d] < (int64_t{1} << 20)) compact *= leaf->shape[d];
    }
  }
  const uint8_t bits = in.ConsumeBool() ? static_cast<uint8_t>(8 << in.ConsumeIntegralInRange<int>(0, 3))
                                        : in.ConsumeIntegral<uint8_t>();
  const uint16_t lanes = in.ConsumeBool() ? 1 : in.ConsumeIntegralInRange<uint16_t>(0, 4);
  const size_t offset = in.ConsumeIntegralInRange<size_t>(0, kArenaBytes);
  const size_t byte_offset = in.ConsumeIntegralInRange<size_t>(0, kArenaBytes - offset);
  leaf->dl.dtype = DLDataType{kDLUInt, bits, lanes};
  leaf->dl.device = Device(in);
  Measure(leaf);
  // A valid size beyond the arena would point qlink at memory the host does not own:
  // shrink the descriptor instead, as the harness may not lie about its memory.
  const size_t room = kArenaBytes - offset - byte_offset;
  if (leaf->valid_size && leaf->bytes > room) {
    for (auto& d : leaf->shape) d = d == 0 ? 0 : 1;
    Measure(leaf);
    if (leaf->bytes > room && !leaf->shape.empty()) leaf->shape[0] = 0;
    Measure(leaf);
    if (leaf->bytes > room) leaf->dl.dtype.lanes = 0;  // a 0-D tensor of a too-wide dtype: refused
  }
  leaf->dl.ndim = ndim;
  leaf->dl.data = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : arena + offset;
  leaf->dl.byte_offset = byte_offset;
  // An ndim out of range, refused before shape is read (an in-range lie would make the
  // descriptor larger than its memory).
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) {
    leaf->dl.ndim = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(INT32_MIN, -1)
                                     : in.ConsumeIntegralInRange<int32_t>(65, INT32_MAX);
  }
}

// Re-points the descriptors at their own vectors (Leaf moves invalidate them).
void Bind(std::vector<Leaf>& leaves, std::vector<DLTensor>* out) {
  for (Leaf& leaf : leaves) {
    leaf.dl.shape = leaf.shape.empty() ? nullptr : leaf.shape.data();
    leaf.dl.strides = leaf.strides.empty() ? nullptr : leaf.strides.data();
    out->push_back(leaf.dl);
  }
}

void FuzzCopy(FuzzedDataProvider& in) {
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, kMaxLeaves);
  std::vector<Leaf> src(n), dst(n);
  for (size_t i = 0; i < n; ++i) {
    Fill(in, &src[i]);
    Fill(in, &dst[i]);
  }
  std::vector<DLTensor> sources, destinations;
  Bind(src, &sources);
  Bind(dst, &destinations);
  std::vector<qlink_stream> streams(in.ConsumeIntegralInRange<size_t>(0, 3));
  for (auto& s : streams) s = qlink_stream{Device(in), nullptr};
  qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE,
                       in.ConsumeIntegralInRange<int>(0, 31) ? sources.data() : nullptr,
                       destinations.data(),
                       n,
                       streams.data(),
                       streams.size()};
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) args.struct_size = in.ConsumeIntegral<uint8_t>();

  std::memcpy(before, arena, kArenaBytes);
  qlink_status status;
  std::string error;  // read before copy_plan_destroy clears it
  if (in.ConsumeBool()) {
    status = api->copy_batch(ctx, &args);
    error = api->last_error();
  } else {
    qlink_copy_plan* plan = nullptr;
    status = api->copy_plan_create(ctx, &args, &plan);
    Require((status == QLINK_OK) == (plan != nullptr));
    if (status == QLINK_OK) status = api->copy_plan_execute(plan, streams.data(), streams.size());
    error = api->last_error();
    Require(api->copy_plan_destroy(plan) == QLINK_OK);
  }
  if (status != QLINK_OK) {
    Require(status == QLINK_INVALID_ARGUMENT && !error.empty());
    Require(std::memcmp(before, arena, kArenaBytes) == 0);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    Require(src[i].valid_size && dst[i].valid_size && src[i].bytes == dst[i].bytes);
    if (src[i].bytes == 0) continue;
    const auto* s = before + (static_cast<const uint8_t*>(sources[i].data) - arena) + sources[i].byte_offset;
    const auto* d = static_cast<const uint8_t*>(destinations[i].data) + destinations[i].byte_offset;
    Require(std::memcmp(s, d, src[i].bytes) == 0);
  }
}

// The smaller entry points: device and peer queries with odd struct sizes, host transfers.
void FuzzQueries(FuzzedDataProvider& in) {
  const int32_t a = in.ConsumeIntegralInRange<int32_t>(-2, kDevices + 1);
  const int32_t b = in.ConsumeIntegralInRange<int32_t>(-2, kDevices + 1);
  qlink_device_info info{};
  info.struct_size = in.ConsumeIntegralInRange<size_t>(0, sizeof(info));
  api->device_info(ctx, a, &info);
  qlink_peer_info peer{};
  peer.struct_size = in.ConsumeIntegralInRange<size_t>(0, sizeof(peer));
  api->peer_info(ctx, a, b, &peer);
  std::vector<int32_t> devices(in.ConsumeIntegralInRange<size_t>(0, 6));
  for (auto& d : devices) d = in.ConsumeIntegralInRange<int32_t>(-1, kDevices);
  api->enable_peer_access(ctx, devices.data(), devices.size());
  const size_t bytes = in.ConsumeIntegralInRange<size_t>(0, kArenaBytes / 2);
  api->memory_to_host(ctx, a, arena, in.ConsumeBool() ? arena + kArenaBytes / 2 : nullptr, bytes);
  api->stream_synchronize(ctx, a, nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string config = R"({"backend": ")" + qlink_test::RunfilePath("libqlink_backend_cpu.so") +
                             R"(", "cpu_devices": 4, "log_level": "off"})";
  api = qlink_get_api(QLINK_ABI_MAJOR, QLINK_ABI_MINOR, nullptr);
  Require(api != nullptr && api->context_create(config.c_str(), &ctx) == QLINK_OK);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    FuzzCopy(in);
  } else {
    FuzzQueries(in);
  }
  return 0;
}
