// Device memory the engine takes for one call, given back when the buffer goes out of
// scope, with the call's running and peak total per device kept for its summary line.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "backends/device_backend.h"

namespace qlink {
namespace quant {

// Bytes the engine holds on one device during a call, and the most it held at once.
struct DeviceUsage {
  std::atomic<uint64_t> now{0};
  std::atomic<uint64_t> peak{0};
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      std::swap(backend_, o.backend_);
      std::swap(usage_, o.usage_);
      std::swap(device_, o.device_);
      std::swap(ptr_, o.ptr_);
      std::swap(bytes_, o.bytes_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static Status Make(DeviceBackend& backend, int device, uint64_t bytes, DeviceUsage* usage, DeviceBuffer* out) {
    out->Reset();
    void* ptr = nullptr;
    QLINK_RETURN_IF_ERROR(backend.Allocate(device, bytes, &ptr));
    out->backend_ = &backend;
    out->usage_ = usage;
    out->device_ = device;
    out->ptr_ = ptr;
    out->bytes_ = bytes;
    const uint64_t now = usage->now.fetch_add(bytes) + bytes;
    uint64_t peak = usage->peak.load();
    while (now > peak && !usage->peak.compare_exchange_weak(peak, now)) {
    }
    return Status::Ok();
  }

  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  uint64_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (ptr_ != nullptr) {
      backend_->Free(device_, ptr_);
      usage_->now.fetch_sub(bytes_);
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }

  DeviceBackend* backend_ = nullptr;
  DeviceUsage* usage_ = nullptr;
  int device_ = 0;
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace quant
}  // namespace qlink
