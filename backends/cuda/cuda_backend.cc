// CUDA backend: the runtime linked statically, so the library needs only the driver
// (libcuda.so.1) at run time; without a driver or GPU it loads and reports zero devices.
#include <cuda_runtime_api.h>

#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/collective_kernels.h"
#include "backends/cuda/pull_kernel.h"
#include "backends/device_backend.h"

namespace qlink {
namespace {

// Turns a runtime error into a Status and drains the runtime's last error, so the host
// framework's next launch does not fail on our leftovers.
Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  std::string message = std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  return e == cudaErrorMemoryAllocation ? OutOfMemory(message) : RuntimeError(message);
}

// Makes `device` current for the enqueue that follows; core restores the host's device
// once per public call.
Status Activate(int device) {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now == device) return Status::Ok();
  return Check(cudaSetDevice(device), "cudaSetDevice");
}

#define QLINK_CUDA_SCOPE(device) QLINK_RETURN_IF_ERROR(Activate(device))

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    sm_counts_.resize(n);
    for (int d = 0; d < n; ++d) cudaDeviceGetAttribute(&sm_counts_[d], cudaDevAttrMultiProcessorCount, d);
  }

  ~CudaBackend() override {
    const int host_device = side_streams_.empty() ? -1 : CurrentDevice();
    for (size_t d = 0; d < side_streams_.size(); ++d) {
      if (side_streams_[d] != nullptr && Activate(static_cast<int>(d)).ok()) cudaStreamDestroy(side_streams_[d]);
    }
    if (host_device >= 0) Activate(host_device);
  }

  const char* name() const override { return "cuda"; }
  DLDeviceType device_type() const override { return kDLCUDA; }
  int device_count() const override { return static_cast<int>(sm_counts_.size()); }

  Status GetProperties(int device, DeviceProperties* out) override {
    cudaDeviceProp prop;
    QLINK_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
    QLINK_CUDA_SCOPE(device);
    size_t free_bytes = 0, total_bytes = 0;
    QLINK_RETURN_IF_ERROR(Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    out->name = prop.name;
    out->total_bytes = total_bytes;
    out->free_bytes = free_bytes;
    return Status::Ok();
  }

  int CurrentDevice() override {
    int device = 0;
    cudaGetDevice(&device);
    return device;
  }
  void MakeCurrent(int device) override { Activate(device); }

  bool HasPeerAccess() const override { return true; }
  Status CanAccessPeer(int accessor, int owner, bool* out) override {
    int can = 0;
    QLINK_RETURN_IF_ERROR(Check(cudaDeviceCanAccessPeer(&can, accessor, owner), "cudaDeviceCanAccessPeer"));
    *out = can != 0;
    return Status::Ok();
  }
  Status EnablePeerAccess(int accessor, int owner) override {
    QLINK_CUDA_SCOPE(accessor);
    cudaError_t e = cudaDeviceEnablePeerAccess(owner, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      e = cudaSuccess;
    }
    QLINK_RETURN_IF_ERROR(Check(e, "cudaDeviceEnablePeerAccess"));
    std::lock_guard<std::mutex> lock(mu_);
    peers_.insert({accessor, owner});
    return Status::Ok();
  }

  Status Allocate(int device, size_t bytes, void** out) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaMalloc(out, bytes), "cudaMalloc");
  }
  void Free(int device, void* ptr) override {
    if (Activate(device).ok()) Check(cudaFree(ptr), "cudaFree");
  }
  Status Memset(int device, void* ptr, int value, size_t bytes, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaMemsetAsync(ptr, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  }
  Status CopyToHost(int device, void* host_dst, const void* device_src, size_t bytes) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  Status CopyFromHost(int device, void* device_dst, const void* host_src, size_t bytes) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy from host");
  }

  Status CreateStream(int device, Stream* out) override {
    QLINK_CUDA_SCOPE(device);
    cudaStream_t s = nullptr;
    QLINK_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    *out = s;
    return Status::Ok();
  }
  void DestroyStream(int device, Stream stream) override {
    if (Activate(device).ok()) Check(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
  }
  Status CreateEvent(int device, Event* out) override {
    QLINK_CUDA_SCOPE(device);
    cudaEvent_t e = nullptr;
    QLINK_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
    *out = e;
    return Status::Ok();
  }
  void DestroyEvent(int device, Event event) override {
    if (Activate(device).ok()) Check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }
  Status RecordEvent(int device, Event event, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
                 "cudaEventRecord");
  }
  Status StreamWaitEvent(int device, Stream stream, Event event) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
                 "cudaStreamWaitEvent");
  }
  Status SynchronizeStream(int device, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }
  bool StreamIdle(int device, Stream stream) override {
    // cudaErrorNotReady is an answer, not an error: it leaves no last error behind.
    return Activate(device).ok() && cudaStreamQuery(static_cast<cudaStream_t>(stream)) == cudaSuccess;
  }

  Status PullLeaves(int dst_device, const CopyLeaf* leaves, size_t count, Stream stream) override {
    QLINK_CUDA_SCOPE(dst_device);
    return Check(cuda::LaunchPullLeaves(leaves, count, sm_counts_[dst_device], static_cast<cudaStream_t>(stream)),
                 "pull kernel launch");
  }

  Status CopyLeaves(int dst_device, int src_device, const CopyLeaf* leaves, size_t count, Stream stream) override {
    QLINK_CUDA_SCOPE(dst_device);
    auto s = static_cast<cudaStream_t>(stream);
    if (count > 1 && (src_device == dst_device || HasPeer(dst_device, src_device))) {
      if (s != nullptr) return CopyBatch(leaves, count, src_device, dst_device, s);
      return ForkedCopyBatch(leaves, count, src_device, dst_device);
    }
    // One runtime peer copy per leaf: staged through host memory by the runtime when the
    // pair has no peer access.
    for (size_t i = 0; i < count; ++i) {
      QLINK_RETURN_IF_ERROR(Check(cudaMemcpyPeerAsync(leaves[i].dst, dst_device, leaves[i].src, src_device,
                                                      leaves[i].bytes, s),
                                  "cudaMemcpyPeerAsync"));
    }
    return Status::Ok();
  }

  // The copy engines overtake the pull kernel between 2 MiB and 16 MiB leaves on NVLink
  // (bench/RESULTS.md).
  uint64_t PullCrossoverBytes() const override { return uint64_t{8} << 20; }

  Status ReduceSum(int device, void* out, const void* const* inputs, size_t num_inputs, bool input_bf16,
                   size_t count, float scale, bool signs, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cuda::LaunchReduceSum(out, inputs, num_inputs, input_bf16, count, scale, signs, sm_counts_[device],
                                       static_cast<cudaStream_t>(stream)),
                 "reduce kernel launch");
  }
  Status CastToBf16(int device, uint16_t* out, const float* in, size_t count, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cuda::LaunchCastToBf16(out, in, count, sm_counts_[device], static_cast<cudaStream_t>(stream)),
                 "bf16 cast kernel launch");
  }
  bool HasOneShot() const override { return true; }
  Status OneShot(int device, const OneShotAllReduce& args, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cuda::LaunchOneShot(args, static_cast<cudaStream_t>(stream)), "one-shot all-reduce launch");
  }
  Status ExpandSigns(int device, float* out, const int8_t* signs, size_t count, Stream stream) override {
    QLINK_CUDA_SCOPE(device);
    return Check(cuda::LaunchExpandSigns(out, signs, count, sm_counts_[device], static_cast<cudaStream_t>(stream)),
                 "sign expansion kernel launch");
  }

 private:
  bool HasPeer(int accessor, int owner) {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_.count({accessor, owner}) > 0;
  }

  // All leaves in one cudaMemcpyBatchAsync call, stream-ordered.
  Status CopyBatch(const CopyLeaf* leaves, size_t count, int src_device, int dst_device, cudaStream_t stream) {
    std::vector<void*> dsts(count);
    std::vector<const void*> srcs(count);
    std::vector<size_t> sizes(count);
    for (size_t i = 0; i < count; ++i) {
      dsts[i] = leaves[i].dst;
      srcs[i] = leaves[i].src;
      sizes[i] = leaves[i].bytes;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = src_device;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = dst_device;
    size_t attr_index = 0;
    return Check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), count, &attr, &attr_index, 1, stream),
                 "cudaMemcpyBatchAsync");
  }

  // The batch API refuses the legacy default stream: fork onto a side stream of the
  // device and join back, so the copy stays ordered on the default stream.
  Status ForkedCopyBatch(const CopyLeaf* leaves, size_t count, int src_device, int dst_device) {
    cudaStream_t side = nullptr;
    QLINK_RETURN_IF_ERROR(SideStream(dst_device, &side));
    cudaEvent_t fork = nullptr, join = nullptr;
    Status s = Check(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cudaEventCreate");
    if (s.ok()) s = Check(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "cudaEventCreate");
    if (s.ok()) s = Check(cudaEventRecord(fork, nullptr), "cudaEventRecord");
    if (s.ok()) s = Check(cudaStreamWaitEvent(side, fork, 0), "cudaStreamWaitEvent");
    if (s.ok()) s = CopyBatch(leaves, count, src_device, dst_device, side);
    if (s.ok()) s = Check(cudaEventRecord(join, side), "cudaEventRecord");
    if (s.ok()) s = Check(cudaStreamWaitEvent(nullptr, join, 0), "cudaStreamWaitEvent");
    // Destroying an event with pending waits is safe: its resources go once it completes.
    if (fork != nullptr) cudaEventDestroy(fork);
    if (join != nullptr) cudaEventDestroy(join);
    return s;
  }

  Status SideStream(int device, cudaStream_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (side_streams_.empty()) side_streams_.resize(sm_counts_.size(), nullptr);
    if (side_streams_[device] == nullptr) {
      QLINK_RETURN_IF_ERROR(
          Check(cudaStreamCreateWithFlags(&side_streams_[device], cudaStreamNonBlocking), "cudaStreamCreate"));
    }
    *out = side_streams_[device];
    return Status::Ok();
  }

  std::vector<int> sm_counts_;
  std::mutex mu_;
  std::vector<cudaStream_t> side_streams_;  // per device, created on first use
  std::set<std::pair<int, int>> peers_;  // (accessor, owner) pairs enabled through this backend
};

}  // namespace
}  // namespace qlink

extern "C" qlink::DeviceBackend* qlink_backend_v1(const qlink::BackendOptions*, std::string* error) {
  auto* backend = new (std::nothrow) qlink::CudaBackend();
  if (backend == nullptr) *error = "cuda backend: out of host memory";
  return backend;
}
