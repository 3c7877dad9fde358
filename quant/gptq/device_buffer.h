// Device memory the engine takes for one call, from the context's scratch pool: blocks
// come back to the pool when their buffer goes out of scope, marked with the stream that
// last used them, so later calls reuse them instead of allocating (cudaMalloc and cudaFree
// of the engine's hundreds of MiB cost milliseconds a call). The call's running and peak
// total per device are kept for its summary line.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/scratch_pool.h"

namespace qlink {
namespace quant {

// Where one device's buffers of a call come from, and how much they hold.
struct Workspace {
  Workspace(ScratchPool& pool, int device, Stream stream) : pool(&pool), device(device), stream(stream) {}
  ScratchPool* pool;
  int device;
  Stream stream;  // the stream the call's work on `device` runs on
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
      std::swap(ws_, o.ws_);
      std::swap(block_, o.block_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` on ws's device, usable on ws.stream.
  static Status Make(Workspace& ws, uint64_t bytes, DeviceBuffer* out) {
    out->Reset();
    QLINK_RETURN_IF_ERROR(ws.pool->Acquire(ws.device, bytes, ws.stream, &out->block_));
    out->ws_ = &ws;
    const uint64_t now = ws.now.fetch_add(out->block_->bytes) + out->block_->bytes;
    uint64_t peak = ws.peak.load();
    while (now > peak && !ws.peak.compare_exchange_weak(peak, now)) {
    }
    return Status::Ok();
  }

  template <typename T>
  T* as() const {
    return block_ == nullptr ? nullptr : static_cast<T*>(block_->ptr);
  }

 private:
  void Reset() {
    if (block_ != nullptr) {
      ws_->now.fetch_sub(block_->bytes);
      (void)ws_->pool->Release(block_, ws_->stream);  // a block it cannot mark stays out of use
    }
    block_ = nullptr;
  }

  Workspace* ws_ = nullptr;
  ScratchPool::Block* block_ = nullptr;
};

// `host` copied into a new buffer on ws's device; an empty vector leaves *out empty. The
// copy is the host's, so the host first waits for ws.stream, which waits for the block's
// last use: a block handed back by another lane of the call may still be read there.
template <typename T>
Status Upload(DeviceBackend& backend, const std::vector<T>& host, Workspace& ws, DeviceBuffer* out) {
  if (host.empty()) return Status::Ok();
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(ws, sizeof(T) * host.size(), out));
  QLINK_RETURN_IF_ERROR(backend.SynchronizeStream(ws.device, ws.stream));
  return backend.CopyFromHost(ws.device, out->as<T>(), host.data(), sizeof(T) * host.size());
}

}  // namespace quant
}  // namespace qlink
