// The GPU backend, one source for CUDA and HIP (gpu_runtime.h). The CUDA build links the
// runtime statically, so it needs only the driver (libcuda.so.1) at run time; the HIP
// build links the HIP runtime. Without a driver or GPU either loads and reports zero
// devices.

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/device_backend.h"
#include "backends/gpu/collective_kernels.h"
#include "backends/gpu/gpu_runtime.h"
#include "backends/gpu/gpu_status.h"
#include "backends/gpu/pull_kernel.h"
#include "quant/gpu/gpu_quant_math.h"
#include "quant/gpu/gpu_signround.h"

namespace qlink {
namespace {

using gpu::Activate;
using gpu::Check;

#define QLINK_GPU_SCOPE(device) QLINK_RETURN_IF_ERROR(Activate(device))

// A pull batch whose descriptors live in the destination device's memory.
class TablePull final : public PreparedPull {
 public:
  TablePull(int device, void* table, size_t bytes, unsigned grid)
      : device_(device), table_(table), bytes_(bytes), grid_(grid) {}
  ~TablePull() override {
    if (Activate(device_).ok()) (void)Check(gpuFree(table_), "gpuFree");
  }
  Status Launch(Stream stream) override {
    QLINK_GPU_SCOPE(device_);
    return Check(gpu::LaunchPullTable(table_, bytes_, grid_, static_cast<gpuStream_t>(stream)), "pull kernel launch");
  }

 private:
  int device_;
  void* table_;
  size_t bytes_;
  unsigned grid_;
};

class GpuBackend final : public DeviceBackend {
 public:
  explicit GpuBackend(quant::Libraries libraries) : libraries_(std::move(libraries)) {
    int n = 0;
    if (gpuGetDeviceCount(&n) != gpuSuccess) {
      (void)gpuGetLastError();
      n = 0;
    }
    sm_counts_.resize(n);
    for (int d = 0; d < n; ++d) (void)gpuDeviceGetAttribute(&sm_counts_[d], gpuDevAttrMultiProcessorCount, d);
  }

  ~GpuBackend() override {
    const int host_device = sides_.empty() ? -1 : CurrentDevice();
    for (size_t d = 0; d < sides_.size(); ++d) {
      if (sides_[d] && Activate(static_cast<int>(d)).ok()) DestroySide(*sides_[d]);
    }
    if (host_device >= 0) Activate(host_device);
  }

  const char* name() const override { return QLINK_GPU_BACKEND_NAME; }
  DLDeviceType device_type() const override { return QLINK_GPU_DEVICE_TYPE; }
  int device_count() const override { return static_cast<int>(sm_counts_.size()); }

  Status GetProperties(int device, DeviceProperties* out) override {
    gpuDeviceProp prop;
    QLINK_RETURN_IF_ERROR(Check(gpuGetDeviceProperties(&prop, device), "gpuGetDeviceProperties"));
    QLINK_GPU_SCOPE(device);
    size_t free_bytes = 0, total_bytes = 0;
    QLINK_RETURN_IF_ERROR(Check(gpuMemGetInfo(&free_bytes, &total_bytes), "gpuMemGetInfo"));
    out->name = prop.name;
    out->total_bytes = total_bytes;
    out->free_bytes = free_bytes;
    return Status::Ok();
  }

  int CurrentDevice() override {
    int device = 0;
    (void)gpuGetDevice(&device);
    return device;
  }
  void MakeCurrent(int device) override { Activate(device); }

  bool HasPeerAccess() const override { return true; }
  Status CanAccessPeer(int accessor, int owner, bool* out) override {
    int can = 0;
    QLINK_RETURN_IF_ERROR(Check(gpuDeviceCanAccessPeer(&can, accessor, owner), "gpuDeviceCanAccessPeer"));
    *out = can != 0;
    return Status::Ok();
  }
  Status EnablePeerAccess(int accessor, int owner) override {
    if (HasPeer(accessor, owner)) return Status::Ok();  // asks the runtime nothing, so it reports nothing
    QLINK_GPU_SCOPE(accessor);
    gpuError_t e = gpuDeviceEnablePeerAccess(owner, 0);
    if (e == gpuErrorPeerAccessAlreadyEnabled) {  // by the host framework, say
      (void)gpuGetLastError();
      e = gpuSuccess;
    }
    QLINK_RETURN_IF_ERROR(Check(e, "gpuDeviceEnablePeerAccess"));
    std::lock_guard<std::mutex> lock(PeersMutex());
    Peers().insert({accessor, owner});
    return Status::Ok();
  }

  Status Allocate(int device, size_t bytes, void** out) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpuMalloc(out, bytes), "gpuMalloc");
  }
  void Free(int device, void* ptr) override {
    if (Activate(device).ok()) Check(gpuFree(ptr), "gpuFree");
  }
  Status Memset(int device, void* ptr, int value, size_t bytes, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpuMemsetAsync(ptr, value, bytes, static_cast<gpuStream_t>(stream)), "gpuMemsetAsync");
  }
  Status CopyToHost(int device, void* host_dst, const void* device_src, size_t bytes) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpuMemcpy(host_dst, device_src, bytes, gpuMemcpyDeviceToHost), "gpuMemcpy to host");
  }
  // Complete when it returns. A runtime memcpy from pageable memory returns once the bytes
  // are staged, its DMA still running on the legacy stream, which a non-blocking stream's
  // next kernel does not wait for: the GPTQ engine's lanes read index tables uploaded that
  // way before they landed (an illegal address, only with several lanes at once). On the
  // device's own upload stream instead, waited for.
  Status CopyFromHost(int device, void* device_dst, const void* host_src, size_t bytes) override {
    QLINK_GPU_SCOPE(device);
    Side* side = nullptr;
    QLINK_RETURN_IF_ERROR(SideOf(device, &side));
    QLINK_RETURN_IF_ERROR(Check(gpuMemcpyAsync(device_dst, host_src, bytes, gpuMemcpyHostToDevice, side->upload),
                                "gpuMemcpyAsync from host"));
    return Check(gpuStreamSynchronize(side->upload), "gpuStreamSynchronize");
  }

  Status CreateStream(int device, Stream* out) override {
    QLINK_GPU_SCOPE(device);
    gpuStream_t s = nullptr;
    QLINK_RETURN_IF_ERROR(Check(gpuStreamCreateWithFlags(&s, gpuStreamNonBlocking), "gpuStreamCreate"));
    *out = s;
    return Status::Ok();
  }
  void DestroyStream(int device, Stream stream) override {
    if (Activate(device).ok()) Check(gpuStreamDestroy(static_cast<gpuStream_t>(stream)), "gpuStreamDestroy");
  }
  Status CreateEvent(int device, Event* out) override {
    QLINK_GPU_SCOPE(device);
    gpuEvent_t e = nullptr;
    QLINK_RETURN_IF_ERROR(Check(gpuEventCreateWithFlags(&e, gpuEventDisableTiming), "gpuEventCreate"));
    *out = e;
    return Status::Ok();
  }
  void DestroyEvent(int device, Event event) override {
    if (Activate(device).ok()) Check(gpuEventDestroy(static_cast<gpuEvent_t>(event)), "gpuEventDestroy");
  }
  Status RecordEvent(int device, Event event, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpuEventRecord(static_cast<gpuEvent_t>(event), static_cast<gpuStream_t>(stream)), "gpuEventRecord");
  }
  Status StreamWaitEvent(int device, Stream stream, Event event) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpuStreamWaitEvent(static_cast<gpuStream_t>(stream), static_cast<gpuEvent_t>(event), 0),
                 "gpuStreamWaitEvent");
  }
  Status SynchronizeStream(int device, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpuStreamSynchronize(static_cast<gpuStream_t>(stream)), "gpuStreamSynchronize");
  }
  bool StreamIdle(int device, Stream stream) override {
    // gpuErrorNotReady is an answer, not an error: it leaves no last error behind.
    return Activate(device).ok() && gpuStreamQuery(static_cast<gpuStream_t>(stream)) == gpuSuccess;
  }

  Status PullLeaves(int dst_device, const CopyLeaf* leaves, size_t count, Stream stream) override {
    QLINK_GPU_SCOPE(dst_device);
    return Check(gpu::LaunchPullLeaves(leaves, count, sm_counts_[dst_device], static_cast<gpuStream_t>(stream)),
                 "pull kernel launch");
  }

  Status PreparePull(int dst_device, const CopyLeaf* leaves, size_t count,
                     std::unique_ptr<PreparedPull>* out) override {
    std::vector<char> host;
    const unsigned grid = gpu::DescribePullTable(leaves, count, sm_counts_[dst_device], &host);
    void* table = nullptr;
    QLINK_RETURN_IF_ERROR(Allocate(dst_device, host.size(), &table));
    auto pull = std::make_unique<TablePull>(dst_device, table, host.size(), grid);  // frees the table from here on
    QLINK_RETURN_IF_ERROR(CopyFromHost(dst_device, table, host.data(), host.size()));
    *out = std::move(pull);
    return Status::Ok();
  }

  Status CopyLeaves(int dst_device, int src_device, const CopyLeaf* leaves, size_t count, Stream stream) override {
    QLINK_GPU_SCOPE(dst_device);
    auto s = static_cast<gpuStream_t>(stream);
#if defined(QLINK_GPU_HAS_BATCH_COPY)
    if (count > 1 && (src_device == dst_device || HasPeer(dst_device, src_device))) {
      if (s != nullptr) return CopyBatch(leaves, count, src_device, dst_device, s);
      return ForkedCopyBatch(leaves, count, src_device, dst_device);
    }
#endif
    // One runtime peer copy per leaf: staged through host memory by the runtime when the
    // pair has no peer access.
    for (size_t i = 0; i < count; ++i) {
      QLINK_RETURN_IF_ERROR(
          Check(gpuMemcpyPeerAsync(leaves[i].dst, dst_device, leaves[i].src, src_device, leaves[i].bytes, s),
                "gpuMemcpyPeerAsync"));
    }
    return Status::Ok();
  }

  // The copy engines overtake the pull kernel between 2 MiB and 16 MiB leaves on NVLink
  // (docs/BASELINES.md).
  uint64_t PullCrossoverBytes() const override { return uint64_t{8} << 20; }

  Status ReduceSum(int device, void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                   float scale, bool signs, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpu::LaunchReduceSum(out, inputs, num_inputs, input_bf16, count, scale, signs, sm_counts_[device],
                                      static_cast<gpuStream_t>(stream)),
                 "reduce kernel launch");
  }
  Status CastToBf16(int device, uint16_t* out, const float* in, size_t count, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpu::LaunchCastToBf16(out, in, count, sm_counts_[device], static_cast<gpuStream_t>(stream)),
                 "bf16 cast kernel launch");
  }
  bool HasOneShot() const override { return true; }
  Status OneShot(int device, const OneShotAllReduce& args, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpu::LaunchOneShot(args, static_cast<gpuStream_t>(stream)), "one-shot all-reduce launch");
  }
  Status ExpandSigns(int device, float* out, const int8_t* signs, size_t count, Stream stream) override {
    QLINK_GPU_SCOPE(device);
    return Check(gpu::LaunchExpandSigns(out, signs, count, sm_counts_[device], static_cast<gpuStream_t>(stream)),
                 "sign expansion kernel launch");
  }

  Status GetQuantMath(quant::QuantMath** out) override {
    std::lock_guard<std::mutex> lock(quant_mu_);
    if (!quant_) QLINK_RETURN_IF_ERROR(quant::MakeGpuQuantMath(libraries_, device_count(), &quant_));
    *out = quant_.get();
    return Status::Ok();
  }

  Status GetSignRoundMath(quant::SignRoundMath** out) override {
    *out = signround_.get();
    return Status::Ok();
  }

 private:
  // Peer access belongs to the process (its primary contexts), not to one backend object:
  // every context of the process shares what was enabled.
  static std::set<std::pair<int, int>>& Peers() {
    static auto* peers = new std::set<std::pair<int, int>>();  // (accessor, owner)
    return *peers;
  }
  static std::mutex& PeersMutex() {
    static auto* mu = new std::mutex();
    return *mu;
  }
  static bool HasPeer(int accessor, int owner) {
    std::lock_guard<std::mutex> lock(PeersMutex());
    return Peers().count({accessor, owner}) > 0;
  }

#if defined(QLINK_GPU_HAS_BATCH_COPY)
  // All leaves in one cudaMemcpyBatchAsync call, stream-ordered.
  Status CopyBatch(const CopyLeaf* leaves, size_t count, int src_device, int dst_device, gpuStream_t stream) {
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
  // device and join back, so the copy stays ordered on the default stream. The side
  // stream's fork and join events are reused: a wait captures the event's state when it
  // is enqueued, and the device's lock keeps two forks from interleaving.
  Status ForkedCopyBatch(const CopyLeaf* leaves, size_t count, int src_device, int dst_device) {
    Side* side = nullptr;
    QLINK_RETURN_IF_ERROR(SideOf(dst_device, &side));
    std::lock_guard<std::mutex> lock(side->mu);
    Status s = Check(gpuEventRecord(side->fork, nullptr), "gpuEventRecord");
    if (s.ok()) s = Check(gpuStreamWaitEvent(side->stream, side->fork, 0), "gpuStreamWaitEvent");
    if (s.ok()) s = CopyBatch(leaves, count, src_device, dst_device, side->stream);
    if (s.ok()) s = Check(gpuEventRecord(side->join, side->stream), "gpuEventRecord");
    if (s.ok()) s = Check(gpuStreamWaitEvent(nullptr, side->join, 0), "gpuStreamWaitEvent");
    return s;
  }
#endif

  // Per device: a stream beside the host's and the events that fork onto it and join back;
  // and the stream host-to-device copies run on, each waited for.
  struct Side {
    std::mutex mu;
    gpuStream_t stream = nullptr;
    gpuEvent_t fork = nullptr, join = nullptr;
    gpuStream_t upload = nullptr;
  };

  Status SideOf(int device, Side** out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sides_.empty()) sides_.resize(sm_counts_.size());
    if (!sides_[device]) {
      auto side = std::make_unique<Side>();
      QLINK_GPU_SCOPE(device);
      Status s = Check(gpuStreamCreateWithFlags(&side->stream, gpuStreamNonBlocking), "gpuStreamCreate");
      if (s.ok()) s = Check(gpuStreamCreateWithFlags(&side->upload, gpuStreamNonBlocking), "gpuStreamCreate");
      if (s.ok()) s = Check(gpuEventCreateWithFlags(&side->fork, gpuEventDisableTiming), "gpuEventCreate");
      if (s.ok()) s = Check(gpuEventCreateWithFlags(&side->join, gpuEventDisableTiming), "gpuEventCreate");
      if (!s.ok()) {
        DestroySide(*side);
        return s;
      }
      sides_[device] = std::move(side);
    }
    *out = sides_[device].get();
    return Status::Ok();
  }

  static void DestroySide(Side& side) {
    if (side.join != nullptr) (void)gpuEventDestroy(side.join);
    if (side.fork != nullptr) (void)gpuEventDestroy(side.fork);
    if (side.stream != nullptr) (void)gpuStreamDestroy(side.stream);
    if (side.upload != nullptr) (void)gpuStreamDestroy(side.upload);
  }

  std::vector<int> sm_counts_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Side>> sides_;  // per device, created on first use
  const quant::Libraries libraries_;          // what the quant engine loads
  std::mutex quant_mu_;
  std::unique_ptr<quant::QuantMath> quant_;  // the GPTQ engine's part, made on first use
  const std::unique_ptr<quant::SignRoundMath> signround_ = quant::MakeGpuSignRoundMath();
};

Status Create(const qlink_backend_options& options, std::unique_ptr<DeviceBackend>* out) {
  *out = std::make_unique<GpuBackend>(quant::Libraries{options.blas_library, options.solver_library});
  return Status::Ok();
}

}  // namespace
}  // namespace qlink

QLINK_EXPORT_BACKEND(qlink::Create)
