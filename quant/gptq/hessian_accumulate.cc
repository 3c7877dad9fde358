#include "quant/gptq/hessian_accumulate.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/stream_joins.h"
#include "core/stream_list.h"
#include "core/tensor_check.h"
#include "quant/gptq/device_buffer.h"
#include "quant/gptq/engine_math.h"
#include "quant/gptq/layers.h"

namespace qlink {
namespace quant {
namespace {

// A stream of one device made for one call, destroyed with it (work on it still completes).
class CallStream {
 public:
  CallStream(DeviceBackend& backend, int device) : backend_(backend), device_(device) {}
  ~CallStream() {
    if (stream_ != nullptr) backend_.DestroyStream(device_, stream_);
  }
  CallStream(const CallStream&) = delete;
  CallStream& operator=(const CallStream&) = delete;

  Status Open() { return backend_.CreateStream(device_, &stream_); }
  Stream get() const { return stream_; }

 private:
  DeviceBackend& backend_;
  const int device_;
  Stream stream_ = nullptr;
};

// h += x^T x for activations narrower than fp32: they reach the rank-k update as fp32, a
// bounded chunk of rows at a time. With more than one chunk, the next chunk is converted
// on a second stream into the other of two staging buffers while the update of the
// current one runs (the update is bound by arithmetic, the conversion by memory).
Status AccumulateNarrow(Context& ctx, QuantMath& math, int device, Stream stream, const DLTensor& x, int64_t rows,
                        int64_t n, float* h, Workspace* workspace) {
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{512} << 20) / (4 * n)));
  const int64_t row_bytes = n * (x.dtype.bits / 8);
  DeviceBuffer staged[2];
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * chunk * n, &staged[0]));
  if (chunk == rows) {
    QLINK_RETURN_IF_ERROR(math.ToFloat(device, stream, DataOf(x), x.dtype, rows * n, staged[0].as<float>()));
    return math.SyrkAccumulate(device, stream, staged[0].as<float>(), rows, n, h);
  }
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * chunk * n, &staged[1]));
  CallStream side(ctx.backend(), device);
  QLINK_RETURN_IF_ERROR(side.Open());
  StreamJoins joins(ctx);
  Event mark = nullptr, consumed[2] = {nullptr, nullptr};
  // The side stream starts after what `stream` holds so far (the staging buffers' last use).
  QLINK_RETURN_IF_ERROR(joins.Record(device, stream, &mark));
  QLINK_RETURN_IF_ERROR(joins.Wait(device, side.get(), mark));
  for (int64_t r = 0, k = 0; r < rows; r += chunk, ++k) {
    const int b = static_cast<int>(k % 2);
    const int64_t m = std::min(chunk, rows - r);
    if (k >= 2) QLINK_RETURN_IF_ERROR(joins.Wait(device, side.get(), consumed[b]));
    QLINK_RETURN_IF_ERROR(
        math.ToFloat(device, side.get(), DataOf(x) + r * row_bytes, x.dtype, m * n, staged[b].as<float>()));
    QLINK_RETURN_IF_ERROR(joins.Record(device, side.get(), &mark));
    QLINK_RETURN_IF_ERROR(joins.Wait(device, stream, mark));
    QLINK_RETURN_IF_ERROR(math.SyrkAccumulate(device, stream, staged[b].as<float>(), m, n, h));
    QLINK_RETURN_IF_ERROR(joins.Record(device, stream, &consumed[b]));
  }
  return Status::Ok();  // every conversion is ordered before an update on `stream`
}

// Rows per tensor-core product where it is a GemmEx (HIP; CUDA for n % 8 != 0 or misaligned
// x): each block's sum leaves the tensor cores' accumulators for the fp32 partial (beta =
// 1), which bounds how many products are summed below IEEE fp32 precision. 2048 is one
// calibration sample of GPTQModel's, what its hooks pass. CUDA's own kernel already adds
// every 32 rows' sum in IEEE fp32, so for it the blocks change nothing but the launches.
constexpr int64_t kTensorRows = 2048;

Status AccumulateTensor(QuantMath& math, int device, Stream stream, const DLTensor& x, int64_t rows, int64_t n,
                        float* h, bool vendor_gemm) {
  const int64_t row_bytes = n * (x.dtype.bits / 8);
  for (int64_t r = 0; r < rows; r += kTensorRows) {
    QLINK_RETURN_IF_ERROR(math.TensorSyrkAccumulate(device, stream, DataOf(x) + r * row_bytes, x.dtype,
                                                    std::min(kTensorRows, rows - r), n, h, vendor_gemm));
  }
  return Status::Ok();
}

// The call's precision: its own field where struct_size covers it and it is not DEFAULT,
// else the context's config.
Status PrecisionOf(const Context& ctx, const qlink_hessian_args& args, HessianPrecision* out) {
  const int32_t asked =
      args.struct_size >= QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_6 ? args.precision : QLINK_HESSIAN_PRECISION_DEFAULT;
  switch (asked) {
    case QLINK_HESSIAN_PRECISION_DEFAULT:
      *out = ctx.config().hessian_precision;
      return Status::Ok();
    case QLINK_HESSIAN_PRECISION_IEEE_FP32:
      *out = HessianPrecision::kIeeeFp32;
      return Status::Ok();
    case QLINK_HESSIAN_PRECISION_TENSOR:
      *out = HessianPrecision::kTensor;
      return Status::Ok();
    case QLINK_HESSIAN_PRECISION_TENSOR_GEMM:
      *out = HessianPrecision::kTensorGemm;
      return Status::Ok();
    default:
      return InvalidArgument("args->precision = " + std::to_string(asked) +
                             " is not one of 0 (DEFAULT), 1 (IEEE_FP32), 2 (TENSOR), 3 (TENSOR_GEMM)");
  }
}

}  // namespace

Status HessianAccumulate(Context& ctx, const qlink_hessian_args* args) {
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(args->struct_size, QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_4, "args", "1.4"));
  if (args->num_inputs > 0 && args->inputs == nullptr)
    return InvalidArgument("args->inputs is NULL with num_inputs > 0");
  if (args->num_partials > 0 && args->partials == nullptr) {
    return InvalidArgument("args->partials is NULL with num_partials > 0");
  }
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, args->streams, args->num_streams));
  HessianPrecision precision = HessianPrecision::kIeeeFp32;
  QLINK_RETURN_IF_ERROR(PrecisionOf(ctx, *args, &precision));
  DeviceBackend& backend = ctx.backend();
  const int32_t* named = args->struct_size >= QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_8 ? args->input_partials : nullptr;
  std::map<int, size_t> partial_of;  // device -> partials index, where inputs do not name theirs
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
    if (named == nullptr && !partial_of.emplace(p.device.device_id, i).second) {
      return InvalidArgument(what + " is a second partial on device " + std::to_string(p.device.device_id) +
                             " (input_partials, 1.8, names each input's)");
    }
  }
  std::vector<int64_t> rows(args->num_inputs);
  std::vector<size_t> partial_index(args->num_inputs);
  for (size_t i = 0; i < args->num_inputs; ++i) {
    const DLTensor& x = args->inputs[i];
    const std::string what = "args->inputs[" + std::to_string(i) + "]";
    uint64_t bytes = 0;
    QLINK_RETURN_IF_ERROR(CheckTensor(x, what, backend.device_type(), backend.device_count(), &bytes));
    if (!IsFloatDtype(x.dtype)) return InvalidArgument(what + " is not float32, bfloat16 or float16");
    if (named != nullptr) {
      const int32_t k = named[i];
      const std::string which = "args->input_partials[" + std::to_string(i) + "] = " + std::to_string(k);
      if (k < 0 || static_cast<size_t>(k) >= args->num_partials) {
        return InvalidArgument(which + " is not an index of args->partials (" + std::to_string(args->num_partials) +
                               ")");
      }
      if (args->partials[k].device.device_id != x.device.device_id) {
        return InvalidArgument(which + ": " + what + " is on device " + std::to_string(x.device.device_id) +
                               ", its partial on device " + std::to_string(args->partials[k].device.device_id));
      }
      partial_index[i] = static_cast<size_t>(k);
    } else {
      auto p = partial_of.find(x.device.device_id);
      if (p == partial_of.end()) {
        return InvalidArgument(what + " is on device " + std::to_string(x.device.device_id) + ", which has no partial");
      }
      partial_index[i] = p->second;
    }
    const int64_t n = args->partials[partial_index[i]].shape[0];
    if (x.ndim < 1 || x.shape[x.ndim - 1] != n) {
      return InvalidArgument(what + " does not end in its partial's " + std::to_string(n) + " columns");
    }
    rows[i] = n == 0 ? 0 : static_cast<int64_t>(bytes / (x.dtype.bits / 8) / n);
  }
  if (args->num_inputs == 0) return Status::Ok();
  QuantMath* math = nullptr;
  QLINK_RETURN_IF_ERROR(GetEngineMath(ctx, &math));
  // Without tensor cores the IEEE path gives what they would: 16-bit products are exact in fp32.
  const bool tensor = precision != HessianPrecision::kIeeeFp32 && math->HasTensorSyrk();
  const bool vendor_gemm = precision == HessianPrecision::kTensorGemm;
  std::set<size_t> touched;  // partials that received an input
  for (size_t i = 0; i < args->num_inputs; ++i) {
    const DLTensor& x = args->inputs[i];
    const int device = x.device.device_id;
    touched.insert(partial_index[i]);
    const DLTensor& partial = args->partials[partial_index[i]];
    const int64_t n = partial.shape[0];
    float* h = reinterpret_cast<float*>(MutableDataOf(partial));
    const Stream stream = StreamFor(device, args->streams, args->num_streams);
    Workspace workspace(ctx.scratch(), device, stream);
    if (x.dtype.bits == 32) {
      QLINK_RETURN_IF_ERROR(
          math->SyrkAccumulate(device, stream, reinterpret_cast<const float*>(DataOf(x)), rows[i], n, h));
      continue;
    }
    if (tensor) {
      QLINK_RETURN_IF_ERROR(AccumulateTensor(*math, device, stream, x, rows[i], n, h, vendor_gemm));
      continue;
    }
    QLINK_RETURN_IF_ERROR(AccumulateNarrow(ctx, *math, device, stream, x, rows[i], n, h, &workspace));
  }
  // Both triangles, once per partial touched.
  for (size_t k : touched) {
    const DLTensor& partial = args->partials[k];
    const int device = partial.device.device_id;
    QLINK_RETURN_IF_ERROR(math->MirrorTriangle(device, StreamFor(device, args->streams, args->num_streams),
                                               reinterpret_cast<float*>(MutableDataOf(partial)), partial.shape[0],
                                               /*lower_to_upper=*/true));
  }
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
