// Fault-injecting test backend: N virtual devices in host memory like the CPU backend,
// but with peer access, asynchronous streams (a worker thread each, optionally slow) and
// the faults FaultOptions lists: refused or asymmetric peer pairs, a leaf that fails in
// the middle of a batch, a failing allocation, a device that is lost. No one-shot
// all-reduce (the interface's default): its workers run one stream each, so spinning
// ranks could wait on each other forever. Tests only.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/device_backend.h"
#include "backends/fault/fault_options.h"
#include "backends/fault/stream_worker.h"

namespace qlink {
namespace {

constexpr uint64_t kTotalBytes = uint64_t{1} << 30;  // what GetProperties reports per device

// Events capture the last record, as cudaStreamWaitEvent does: a wait enqueued before a
// later re-record still waits for the earlier one only.
struct FaultEvent {
  explicit FaultEvent(int d) : device(d) {}
  const int device;
  std::mutex mu;
  std::shared_ptr<Completion> latest;  // null until recorded
};

thread_local int current_device = 0;

class FaultBackend final : public DeviceBackend {
 public:
  explicit FaultBackend(FaultOptions options) : options_(std::move(options)) {
    for (int d = 0; d < options_.devices; ++d) default_streams_.push_back(std::make_unique<StreamWorker>(Delay(d)));
  }

  const char* name() const override { return "fault"; }
  DLDeviceType device_type() const override { return kDLCPU; }
  int device_count() const override { return options_.devices; }

  Status GetProperties(int device, DeviceProperties* out) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    out->name = "fault:virtual:" + std::to_string(device);
    out->total_bytes = kTotalBytes;
    out->free_bytes = kTotalBytes;
    return Status::Ok();
  }

  int CurrentDevice() override { return current_device; }
  void MakeCurrent(int device) override { current_device = device; }

  bool HasPeerAccess() const override { return true; }
  Status CanAccessPeer(int accessor, int owner, bool* out) override {
    QLINK_RETURN_IF_ERROR(Alive(accessor));
    QLINK_RETURN_IF_ERROR(Alive(owner));
    *out = options_.unsupported_pairs.count({owner, accessor}) == 0;
    return Status::Ok();
  }
  Status EnablePeerAccess(int accessor, int owner) override {
    QLINK_RETURN_IF_ERROR(Alive(accessor));
    QLINK_RETURN_IF_ERROR(Alive(owner));
    if (options_.enable_failing_pairs.count({owner, accessor}) > 0) {
      return RuntimeError("fault backend: enabling peer access " + Pair(owner, accessor) + " failed (injected)");
    }
    return Status::Ok();
  }

  Status Allocate(int device, size_t bytes, void** out) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    const int64_t n = allocations_.fetch_add(1);
    if (n == options_.fail_allocation) {
      return OutOfMemory("fault backend: allocation " + std::to_string(n) + " (" + std::to_string(bytes) +
                         " bytes on device " + std::to_string(device) + ") failed (injected)");
    }
    *out = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (*out == nullptr && bytes > 0) return OutOfMemory("fault backend: cannot allocate " + std::to_string(bytes));
    return Status::Ok();
  }
  // Like cudaFree: work still queued on the device may use the memory, so wait for it.
  void Free(int device, void* ptr) override {
    default_streams_[device]->Synchronize();
    std::free(ptr);
  }
  Status Memset(int device, void* ptr, int value, size_t bytes, Stream stream) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    Worker(device, stream).Enqueue([=] { std::memset(ptr, value, bytes); });
    return Status::Ok();
  }

  // Synchronous, and ordered after the device's default stream, like cudaMemcpy.
  Status CopyToHost(int device, void* host_dst, const void* device_src, size_t bytes) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    default_streams_[device]->Synchronize();
    std::memcpy(host_dst, device_src, bytes);
    return Status::Ok();
  }
  Status CopyFromHost(int device, void* device_dst, const void* host_src, size_t bytes) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    default_streams_[device]->Synchronize();
    std::memcpy(device_dst, host_src, bytes);
    return Status::Ok();
  }

  Status CreateStream(int device, Stream* out) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    *out = new StreamWorker(Delay(device));
    return Status::Ok();
  }
  void DestroyStream(int, Stream stream) override { delete static_cast<StreamWorker*>(stream); }
  Status CreateEvent(int device, Event* out) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    *out = new FaultEvent(device);
    return Status::Ok();
  }
  void DestroyEvent(int, Event event) override { delete static_cast<FaultEvent*>(event); }
  Status RecordEvent(int device, Event event, Stream stream) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    auto* e = static_cast<FaultEvent*>(event);
    auto mark = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> lock(e->mu);
      e->latest = mark;
    }
    Worker(device, stream).Enqueue([mark] { mark->Set(); });
    return Status::Ok();
  }
  Status StreamWaitEvent(int device, Stream stream, Event event) override {
    auto* e = static_cast<FaultEvent*>(event);
    QLINK_RETURN_IF_ERROR(Alive(device));
    QLINK_RETURN_IF_ERROR(Alive(e->device));
    std::shared_ptr<Completion> mark;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      mark = e->latest;
    }
    if (mark) Worker(device, stream).Enqueue([mark] { mark->Wait(); });
    return Status::Ok();
  }
  Status SynchronizeStream(int device, Stream stream) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    Worker(device, stream).Synchronize();
    return Status::Ok();
  }
  bool StreamIdle(int device, Stream stream) override { return Worker(device, stream).Idle(); }

  Status PullLeaves(int dst_device, const CopyLeaf* leaves, size_t count, Stream dst_stream) override {
    QLINK_RETURN_IF_ERROR(CountCopy(dst_device));
    return EnqueueLeaves(dst_device, leaves, count, dst_stream);
  }
  Status CopyLeaves(int dst_device, int src_device, const CopyLeaf* leaves, size_t count, Stream dst_stream) override {
    QLINK_RETURN_IF_ERROR(CountCopy(dst_device));
    if (src_device != dst_device) QLINK_RETURN_IF_ERROR(CountCopy(src_device));
    return EnqueueLeaves(dst_device, leaves, count, dst_stream);
  }
  // Small enough that tests reach both the pull and the runtime path.
  uint64_t PullCrossoverBytes() const override { return 64 << 10; }

  // The CPU backend's kernels, run in stream order on the worker.
  Status ReduceSum(int device, void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                   float scale, bool signs, Stream stream) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    std::vector<const void*> in(inputs, inputs + num_inputs);
    Worker(device, stream).Enqueue([=, in = std::move(in)] {
      cpu::ReduceSum(out, in.data(), in.size(), input_bf16, count, scale, signs);
    });
    return Status::Ok();
  }
  Status CastToBf16(int device, uint16_t* out, const float* in, size_t count, Stream stream) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    Worker(device, stream).Enqueue([=] { cpu::CastToBf16(out, in, count); });
    return Status::Ok();
  }
  Status ExpandSigns(int device, float* out, const int8_t* signs, size_t count, Stream stream) override {
    QLINK_RETURN_IF_ERROR(Alive(device));
    Worker(device, stream).Enqueue([=] { cpu::ExpandSigns(out, signs, count); });
    return Status::Ok();
  }

 private:
  static std::string Pair(int src, int dst) { return std::to_string(src) + "->" + std::to_string(dst); }

  std::chrono::milliseconds Delay(int device) const {
    const auto& delays = options_.stream_delay_ms;
    return std::chrono::milliseconds(static_cast<size_t>(device) < delays.size() ? delays[device] : 0);
  }

  StreamWorker& Worker(int device, Stream stream) {
    return stream != nullptr ? *static_cast<StreamWorker*>(stream) : *default_streams_[device];
  }

  Status Alive(int device) const {
    if (device == options_.lost_device && lost_.load()) {
      return RuntimeError("fault backend: device " + std::to_string(device) + " lost (injected)");
    }
    return Status::Ok();
  }

  // A copy call touching `device`: counted, and the one after lost_after_copies loses it.
  Status CountCopy(int device) {
    QLINK_RETURN_IF_ERROR(Alive(device));
    if (device == options_.lost_device && copies_.fetch_add(1) >= options_.lost_after_copies) lost_.store(true);
    return Alive(device);
  }

  // Enqueues the leaves as one piece of stream work (the caller's array need not outlive
  // the call). With fail_leaf inside this call, the leaves before it are enqueued and
  // the call fails at it, the way a launch fails part-way through a batch.
  Status EnqueueLeaves(int device, const CopyLeaf* leaves, size_t count, Stream stream) {
    const int64_t first = leaves_.fetch_add(static_cast<int64_t>(count));
    size_t enqueue = count;
    const bool fails = options_.fail_leaf >= first && options_.fail_leaf < first + static_cast<int64_t>(count);
    if (fails) enqueue = static_cast<size_t>(options_.fail_leaf - first);
    std::vector<CopyLeaf> copy(leaves, leaves + enqueue);
    Worker(device, stream).Enqueue([copy = std::move(copy)] {
      for (const CopyLeaf& leaf : copy) std::memcpy(leaf.dst, leaf.src, leaf.bytes);
    });
    if (fails) {
      return RuntimeError("fault backend: copy of leaf " + std::to_string(enqueue) + " of " + std::to_string(count) +
                          " to device " + std::to_string(device) + " failed (injected)");
    }
    return Status::Ok();
  }

  const FaultOptions options_;
  std::vector<std::unique_ptr<StreamWorker>> default_streams_;  // per device
  std::atomic<int64_t> copies_{0};                              // copy calls that touched the lost device
  std::atomic<bool> lost_{false};                               // lost_device is gone
  std::atomic<int64_t> leaves_{0};                              // leaves enqueued over the backend's life
  std::atomic<int64_t> allocations_{0};                         // Allocate calls so far
};

Status Create(const qlink_backend_options& options, std::unique_ptr<DeviceBackend>* out) {
  FaultOptions parsed;
  QLINK_RETURN_IF_ERROR(ParseFaultOptions(options.options_json, &parsed));
  *out = std::make_unique<FaultBackend>(std::move(parsed));
  return Status::Ok();
}

}  // namespace
}  // namespace qlink

QLINK_EXPORT_BACKEND(qlink::Create)
