#include "quant/gptq/hessian_accumulate.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/copy_plan.h"
#include "core/tensor_check.h"
#include "quant/gptq/device_buffer.h"
#include "quant/gptq/layers.h"

namespace qlink {
namespace quant {
namespace {

// A second stream on one device with the events that order two staging buffers between
// it and the call's stream; destroyed with the object (pending work still completes).
struct SideStream {
  SideStream(DeviceBackend& backend, int device) : backend(backend), device(device) {}
  ~SideStream() {
    for (Event e : {start, converted[0], converted[1], consumed[0], consumed[1]}) {
      if (e != nullptr) backend.DestroyEvent(device, e);
    }
    if (stream != nullptr) backend.DestroyStream(device, stream);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  Status Open() {
    QLINK_RETURN_IF_ERROR(backend.CreateStream(device, &stream));
    for (Event* e : {&start, &converted[0], &converted[1], &consumed[0], &consumed[1]}) {
      QLINK_RETURN_IF_ERROR(backend.CreateEvent(device, e));
    }
    return Status::Ok();
  }
  // The side stream waits for the work enqueued on `other` so far.
  Status Follow(Stream other, Event mark) {
    QLINK_RETURN_IF_ERROR(backend.RecordEvent(device, mark, other));
    return backend.StreamWaitEvent(device, stream, mark);
  }

  DeviceBackend& backend;
  const int device;
  Stream stream = nullptr;
  Event start = nullptr, converted[2] = {nullptr, nullptr}, consumed[2] = {nullptr, nullptr};
};

// h += x^T x for activations narrower than fp32: they reach the rank-k update as fp32, a
// bounded chunk of rows at a time. With more than one chunk, the next chunk is converted
// on a second stream into the other of two staging buffers while the update of the
// current one runs (the update is bound by arithmetic, the conversion by memory).
Status AccumulateNarrow(DeviceBackend& backend, QuantMath& math, int device, Stream stream, const DLTensor& x,
                        int64_t rows, int64_t n, float* h, Workspace* workspace) {
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{512} << 20) / (4 * n)));
  const int64_t row_bytes = n * (x.dtype.bits / 8);
  DeviceBuffer staged[2];
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * chunk * n, &staged[0]));
  if (chunk == rows) {
    QLINK_RETURN_IF_ERROR(math.ToFloat(device, stream, DataOf(x), x.dtype, rows * n, staged[0].as<float>()));
    return math.SyrkAccumulate(device, stream, staged[0].as<float>(), rows, n, h);
  }
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * chunk * n, &staged[1]));
  SideStream side(backend, device);
  QLINK_RETURN_IF_ERROR(side.Open());
  // The side stream starts after what `stream` holds so far (the staging buffers' last use).
  QLINK_RETURN_IF_ERROR(side.Follow(stream, side.start));
  for (int64_t r = 0, k = 0; r < rows; r += chunk, ++k) {
    const int b = static_cast<int>(k % 2);
    const int64_t m = std::min(chunk, rows - r);
    if (k >= 2) QLINK_RETURN_IF_ERROR(backend.StreamWaitEvent(device, side.stream, side.consumed[b]));
    QLINK_RETURN_IF_ERROR(math.ToFloat(device, side.stream, DataOf(x) + r * row_bytes, x.dtype, m * n,
                                       staged[b].as<float>()));
    QLINK_RETURN_IF_ERROR(backend.RecordEvent(device, side.converted[b], side.stream));
    QLINK_RETURN_IF_ERROR(backend.StreamWaitEvent(device, stream, side.converted[b]));
    QLINK_RETURN_IF_ERROR(math.SyrkAccumulate(device, stream, staged[b].as<float>(), m, n, h));
    QLINK_RETURN_IF_ERROR(backend.RecordEvent(device, side.consumed[b], stream));
  }
  return Status::Ok();  // every conversion is ordered before an update on `stream`
}

}  // namespace

Status HessianAccumulate(Context& ctx, const qlink_hessian_args* args) {
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(args->struct_size, QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_4, "args", "1.4"));
  if (args->num_inputs > 0 && args->inputs == nullptr) return InvalidArgument("args->inputs is NULL with num_inputs > 0");
  if (args->num_partials > 0 && args->partials == nullptr) {
    return InvalidArgument("args->partials is NULL with num_partials > 0");
  }
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, args->streams, args->num_streams));
  DeviceBackend& backend = ctx.backend();
  std::map<int, size_t> partial_of;  // device -> partials index
  for (size_t i = 0; i < args->num_partials; ++i) {
    const DLTensor& p = args->partials[i];
    const std::string what = "args->partials[" + std::to_string(i) + "]";
    uint64_t bytes = 0;
    QLINK_RETURN_IF_ERROR(CheckTensor(p, what, backend.device_type(), backend.device_count(), &bytes));
    if (p.ndim != 2 || p.shape[0] != p.shape[1] || p.shape[0] < 1) {
      return InvalidArgument(what + " is not a square (columns, columns) matrix");
    }
    if (p.dtype.code != kDLFloat || p.dtype.bits != 32 || p.dtype.lanes != 1) {
      return InvalidArgument(what + " is not float32");
    }
    if (!partial_of.emplace(p.device.device_id, i).second) {
      return InvalidArgument(what + " is a second partial on device " + std::to_string(p.device.device_id));
    }
  }
  std::vector<int64_t> rows(args->num_inputs);
  for (size_t i = 0; i < args->num_inputs; ++i) {
    const DLTensor& x = args->inputs[i];
    const std::string what = "args->inputs[" + std::to_string(i) + "]";
    uint64_t bytes = 0;
    QLINK_RETURN_IF_ERROR(CheckTensor(x, what, backend.device_type(), backend.device_count(), &bytes));
    if (!IsFloatDtype(x.dtype)) return InvalidArgument(what + " is not float32, bfloat16 or float16");
    auto p = partial_of.find(x.device.device_id);
    if (p == partial_of.end()) {
      return InvalidArgument(what + " is on device " + std::to_string(x.device.device_id) + ", which has no partial");
    }
    const int64_t n = args->partials[p->second].shape[0];
    if (x.ndim < 1 || x.shape[x.ndim - 1] != n) {
      return InvalidArgument(what + " does not end in the partial's " + std::to_string(n) + " columns");
    }
    rows[i] = n == 0 ? 0 : static_cast<int64_t>(bytes / (x.dtype.bits / 8) / n);
  }
  if (args->num_inputs == 0) return Status::Ok();
  QuantMath* math = nullptr;
  QLINK_RETURN_IF_ERROR(ctx.backend().GetQuantMath(&math));
  std::set<int> touched;  // devices whose partial received an input
  for (size_t i = 0; i < args->num_inputs; ++i) {
    const DLTensor& x = args->inputs[i];
    const int device = x.device.device_id;
    touched.insert(device);
    const DLTensor& partial = args->partials[partial_of[device]];
    const int64_t n = partial.shape[0];
    float* h = reinterpret_cast<float*>(MutableDataOf(partial));
    const Stream stream = StreamFor(device, args->streams, args->num_streams);
    Workspace workspace(ctx.scratch(), device, stream);
    if (x.dtype.bits == 32) {
      QLINK_RETURN_IF_ERROR(math->SyrkAccumulate(device, stream, reinterpret_cast<const float*>(DataOf(x)), rows[i],
                                                 n, h));
      continue;
    }
    QLINK_RETURN_IF_ERROR(AccumulateNarrow(backend, *math, device, stream, x, rows[i], n, h, &workspace));
  }
  // Both triangles, once per partial touched.
  for (int device : touched) {
    const DLTensor& partial = args->partials[partial_of[device]];
    QLINK_RETURN_IF_ERROR(math->MirrorTriangle(device, StreamFor(device, args->streams, args->num_streams),
                                               reinterpret_cast<float*>(MutableDataOf(partial)), partial.shape[0],
                                               /*lower_to_upper=*/true));
  }
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
