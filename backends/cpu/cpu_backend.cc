// CPU backend: N virtual devices in host memory. Peer access does not apply (no pairs,
// no warning), and every copy completes before the call returns, so the interface's
// defaults (no peers, null streams and events) are this backend, and every engine of core
// runs unchanged on a machine without a GPU.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backends/cpu/cpu_kernels.h"
#include "backends/device_backend.h"
#include "quant/cpu/cpu_quant_math.h"
#include "quant/cpu/cpu_signround.h"

namespace qlink {
namespace {

uint64_t PhysicalBytes(int page_kind) {
  return static_cast<uint64_t>(sysconf(page_kind)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

class CpuBackend final : public DeviceBackend {
 public:
  CpuBackend(int devices, quant::Libraries libraries) : devices_(devices), libraries_(std::move(libraries)) {}

  const char* name() const override { return "cpu"; }
  DLDeviceType device_type() const override { return kDLCPU; }
  int device_count() const override { return devices_; }

  Status GetProperties(int device, DeviceProperties* out) override {
    out->name = "cpu:virtual:" + std::to_string(device);
    out->total_bytes = PhysicalBytes(_SC_PHYS_PAGES);
    out->free_bytes = PhysicalBytes(_SC_AVPHYS_PAGES);
    return Status::Ok();
  }

  Status Allocate(int, size_t bytes, void** out) override {
    *out = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (*out == nullptr && bytes > 0) return OutOfMemory("cpu: cannot allocate " + std::to_string(bytes) + " bytes");
    return Status::Ok();
  }
  void Free(int, void* ptr) override { std::free(ptr); }
  Status Memset(int, void* ptr, int value, size_t bytes, Stream) override {
    std::memset(ptr, value, bytes);
    return Status::Ok();
  }

  Status CopyToHost(int, void* host_dst, const void* device_src, size_t bytes) override {
    std::memcpy(host_dst, device_src, bytes);
    return Status::Ok();
  }
  Status CopyFromHost(int, void* device_dst, const void* host_src, size_t bytes) override {
    std::memcpy(device_dst, host_src, bytes);
    return Status::Ok();
  }

  Status CopyLeaves(int, int, const CopyLeaf* leaves, size_t count, Stream) override {
    for (size_t i = 0; i < count; ++i) std::memcpy(leaves[i].dst, leaves[i].src, leaves[i].bytes);
    return Status::Ok();
  }

  Status ReduceSum(int, void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                   float scale, bool signs, Stream) override {
    cpu::ReduceSum(out, inputs, num_inputs, input_bf16, count, scale, signs);
    return Status::Ok();
  }
  Status CastToBf16(int, uint16_t* out, const float* in, size_t count, Stream) override {
    cpu::CastToBf16(out, in, count);
    return Status::Ok();
  }
  Status ExpandSigns(int, float* out, const int8_t* signs, size_t count, Stream) override {
    cpu::ExpandSigns(out, signs, count);
    return Status::Ok();
  }

  Status GetQuantMath(quant::QuantMath** out) override {
    std::lock_guard<std::mutex> lock(quant_mu_);
    if (!quant_) QLINK_RETURN_IF_ERROR(quant::MakeCpuQuantMath(libraries_, &quant_));
    *out = quant_.get();
    return Status::Ok();
  }

  Status GetSignRoundMath(quant::SignRoundMath** out) override {
    *out = signround_.get();
    return Status::Ok();
  }

 private:
  const int devices_;
  const quant::Libraries libraries_;  // what the quant engine loads
  std::mutex quant_mu_;
  std::unique_ptr<quant::QuantMath> quant_;  // made on first use
  const std::unique_ptr<quant::SignRoundMath> signround_ = quant::MakeCpuSignRoundMath();
};

Status Create(const qlink_backend_options& options, std::unique_ptr<DeviceBackend>* out) {
  if (options.virtual_devices < 1) {
    return InvalidArgument("cpu backend: virtual_devices = " + std::to_string(options.virtual_devices) +
                           " must be >= 1");
  }
  *out = std::make_unique<CpuBackend>(options.virtual_devices,
                                      quant::Libraries{options.blas_library, options.solver_library});
  return Status::Ok();
}

}  // namespace
}  // namespace qlink

QLINK_EXPORT_BACKEND(qlink::Create)
