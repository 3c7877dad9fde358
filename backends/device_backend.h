// The internal interface every device backend implements (TVM DeviceAPI-sized).
//
// Each backend is its own shared library that core loads through Boost.DLL. It exports
// two plain C symbols (QLINK_EXPORT_BACKEND below): its interface version, which core
// checks first, and a factory, which core resolves and calls only when that version is
// its own. A backend whose runtime or device is missing still loads and reports zero
// devices.
//
// Threading: every method may be called from many threads at once. Every enqueue makes
// `device` current first: HIP binds a stream to the calling thread's current device, so
// enqueuing with another device current puts the work on the wrong queue. Methods leave
// that device current; core restores the host's device once per public call
// (CurrentDevice / MakeCurrent), not around every enqueue.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "backends/status.h"

// The version of this interface. Core and backend objects meet through a C++ vtable and
// C++ types (Status, DeviceProperties), so a backend is used only when it was built with
// exactly this version: bump it with every change a built backend would see (a method
// added, removed, reordered or retyped, a struct or a limit changed) to this file,
// backends/status.h, or the engines' per-vendor interfaces handed out below
// (quant/quant_math.h; quant/signround/signround_math_api.h with the SignRoundConfig of
// quant/kernels/signround_math.h). tests/backend_interface_pin_test fails until the bump
// is made.
#define QLINK_BACKEND_INTERFACE_VERSION 8

namespace qlink {

// Limits of the interface: core never asks more, so backends may rely on them.
// Buffers one collective launch takes: ReduceSum's inputs, OneShot's ranks.
constexpr size_t kMaxParticipants = 64;
// Blocks one OneShot launch may use; each rank's flag array has a flag per (rank, block).
constexpr int kOneShotMaxBlocks = 32;
constexpr size_t kOneShotFlagsPerRank = kMaxParticipants * kOneShotMaxBlocks;

namespace quant {
class QuantMath;      // quant/quant_math.h
class SignRoundMath;  // quant/signround/signround_math_api.h
struct Libraries;
}  // namespace quant

using Stream = void*;  // vendor stream handle; nullptr is the device's default stream
using Event = void*;   // vendor event handle

struct DeviceProperties {
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// One contiguous run of bytes to move.
struct CopyLeaf {
  const void* src;
  void* dst;
  uint64_t bytes;
};

// One rank's part of a latency-bound all-reduce done by one kernel per device that
// synchronizes with its peers through flags in peer memory instead of stream events.
struct OneShotAllReduce {
  int rank = 0, world = 0;       // world <= kMaxParticipants
  const float* input = nullptr;  // this rank's buffer
  float* output = nullptr;       // may be `input`
  size_t count = 0;
  void* const* staging = nullptr;    // per rank: that rank's staging slot for this call
  uint64_t* const* flags = nullptr;  // per rank: that rank's kOneShotFlagsPerRank flags, zeroed before first use
  uint64_t epoch = 0;                // strictly increasing per workspace; flags reaching it mean "arrived"
  bool bf16 = false;                 // staged partials are bf16
  float scale = 1.0f;
  bool signs = false;  // output sign(scale * sum) as -1, 0, 1
};

// A pull batch laid out once for repeated launches (prepared copy plans).
class PreparedPull {
 public:
  virtual ~PreparedPull() = default;
  virtual Status Launch(Stream dst_stream) = 0;
};

// Methods with a body are what most backends share; a backend overrides those that are
// not its case. The defaults describe a backend in host memory without peers or a notion
// of the current device, whose work is complete when the call enqueuing it returns.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const char* name() const = 0;
  virtual DLDeviceType device_type() const = 0;
  virtual int device_count() const = 0;
  virtual Status GetProperties(int device, DeviceProperties* out) = 0;

  // The calling thread's current device, and making one current.
  virtual int CurrentDevice() { return 0; }
  virtual void MakeCurrent(int /*device*/) {}

  // Peer access: whether `accessor` may read and write memory owned by `owner`. A
  // backend without the concept returns false from HasPeerAccess and is never asked the
  // rest.
  virtual bool HasPeerAccess() const { return false; }
  virtual Status CanAccessPeer(int /*accessor*/, int /*owner*/, bool* out) {
    *out = false;
    return Status::Ok();
  }
  // Already enabled counts as success; the runtime's sticky error is cleared.
  virtual Status EnablePeerAccess(int /*accessor*/, int /*owner*/) {
    return Unavailable(std::string("the ") + name() + " backend has no peer access");
  }

  // Device memory, for probes and staging. Free takes what Allocate returned.
  virtual Status Allocate(int device, size_t bytes, void** out) = 0;
  virtual void Free(int device, void* ptr) = 0;
  virtual Status Memset(int device, void* ptr, int value, size_t bytes, Stream stream) = 0;
  // Transfers between host memory and a device, complete when they return: the bytes are
  // where any stream reads them next.
  virtual Status CopyToHost(int device, void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual Status CopyFromHost(int device, void* device_dst, const void* host_src, size_t bytes) = 0;

  // Streams and events; by default null handles, with nothing to wait for.
  virtual Status CreateStream(int /*device*/, Stream* out) {
    *out = nullptr;
    return Status::Ok();
  }
  virtual void DestroyStream(int /*device*/, Stream /*stream*/) {}
  virtual Status CreateEvent(int /*device*/, Event* out) {
    *out = nullptr;
    return Status::Ok();
  }
  virtual void DestroyEvent(int /*device*/, Event /*event*/) {}
  virtual Status RecordEvent(int /*device*/, Event /*event*/, Stream /*stream*/) { return Status::Ok(); }
  // `stream` of `device` waits for `event`, which may belong to another device.
  virtual Status StreamWaitEvent(int /*device*/, Stream /*stream*/, Event /*event*/) { return Status::Ok(); }
  virtual Status SynchronizeStream(int /*device*/, Stream /*stream*/) { return Status::Ok(); }
  // True when every piece of work enqueued on `stream` so far has completed.
  virtual bool StreamIdle(int /*device*/, Stream /*stream*/) { return true; }

  // One kernel launch on dst_device that reads every leaf straight from its source's
  // memory: dst_device itself or a device it has peer access to. By default the runtime
  // copy: every device's memory is the host's.
  virtual Status PullLeaves(int dst_device, const CopyLeaf* leaves, size_t count, Stream dst_stream) {
    return CopyLeaves(dst_device, dst_device, leaves, count, dst_stream);
  }
  // Runtime copies (copy engines), staged through host memory by the runtime when the
  // pair has no peer access.
  virtual Status CopyLeaves(int dst_device, int src_device, const CopyLeaf* leaves, size_t count,
                            Stream dst_stream) = 0;
  // PullLeaves over leaves fixed once: the GPU backend keeps their descriptors in
  // device memory, so each launch passes one pointer instead of every descriptor. By
  // default the leaves stay on the host and each launch is a PullLeaves.
  virtual Status PreparePull(int dst_device, const CopyLeaf* leaves, size_t count, std::unique_ptr<PreparedPull>* out);
  // Leaves of at least this many bytes go to CopyLeaves even over a peer link: the
  // measured point where the copy engines overtake the pull kernel. By default never.
  virtual uint64_t PullCrossoverBytes() const { return UINT64_MAX; }

  // Collective kernels, one launch on `device`; inputs may live on peers it can read.
  // out[i] = scale * (inputs[0][i] + inputs[1][i] + ...), accumulated in fp32 in exactly
  // the order given (deterministic whatever order the host handed partials over), from at
  // most kMaxParticipants inputs. Inputs are fp32 or bf16 (input_bf16); the result is
  // written as fp32 to `out`, or, when `signs` is true, as int8 sign(result) in {-1, 0, 1}.
  virtual Status ReduceSum(int device, void* out, const void* const* inputs, size_t num_inputs, bool input_bf16,
                           size_t count, float scale, bool signs, Stream stream) = 0;
  // bf16 (round to nearest even) copy of an fp32 buffer on `device`.
  virtual Status CastToBf16(int device, uint16_t* out, const float* in, size_t count, Stream stream) = 0;
  // out[i] = (float)signs[i]; `signs` may live on a peer.
  virtual Status ExpandSigns(int device, float* out, const int8_t* signs, size_t count, Stream stream) = 0;
  // Whether OneShot can run: every rank's kernel spins until its peers arrive, so the
  // ranks' kernels must be able to run at the same time (not on a synchronous backend).
  virtual bool HasOneShot() const { return false; }
  // Stages input (bf16 if asked) in this rank's slot, raises this rank's flag on every
  // peer, waits for every peer's flag to reach the epoch, then sums every slot in rank
  // order into output.
  virtual Status OneShot(int /*device*/, const OneShotAllReduce& /*args*/, Stream /*stream*/) {
    return Unavailable(std::string(name()) + ": no one-shot all-reduce");
  }

  // The GPTQ engine's linear algebra and kernels on this backend's devices
  // (quant/quant_math.h), made on first use from the libraries the options named, owned
  // by the backend. By default a backend has none.
  virtual Status GetQuantMath(quant::QuantMath** out);
  // SignRound's fused quant-dequant and SignSGD step on this backend's devices
  // (quant/signround/signround_math_api.h), owned by the backend. By default a backend has none.
  virtual Status GetSignRoundMath(quant::SignRoundMath** out);
};

namespace internal {
class HostPreparedPull final : public PreparedPull {
 public:
  HostPreparedPull(DeviceBackend& backend, int device, const CopyLeaf* leaves, size_t count)
      : backend_(backend), device_(device), leaves_(leaves, leaves + count) {}
  Status Launch(Stream stream) override { return backend_.PullLeaves(device_, leaves_.data(), leaves_.size(), stream); }

 private:
  DeviceBackend& backend_;
  int device_;
  std::vector<CopyLeaf> leaves_;
};
}  // namespace internal

inline Status DeviceBackend::GetQuantMath(quant::QuantMath** out) {
  *out = nullptr;
  return Unavailable(std::string("the ") + name() + " backend has no GPTQ engine");
}

inline Status DeviceBackend::GetSignRoundMath(quant::SignRoundMath** out) {
  *out = nullptr;
  return Unavailable(std::string("the ") + name() + " backend has no SignRound engine");
}

inline Status DeviceBackend::PreparePull(int dst_device, const CopyLeaf* leaves, size_t count,
                                         std::unique_ptr<PreparedPull>* out) {
  *out = std::make_unique<internal::HostPreparedPull>(*this, dst_device, leaves, count);
  return Status::Ok();
}

}  // namespace qlink

extern "C" {

// What core hands a backend's factory: C types only, sized by struct_size.
typedef struct qlink_backend_options {
  size_t struct_size;       // sizeof(qlink_backend_options) as core was built
  int32_t virtual_devices;  // config cpu_devices: the CPU backend's device count; others ignore it
  // Config backend_options: a JSON object's text. A backend that takes options refuses
  // keys it does not know; the others ignore it.
  const char* options_json;
  // Config blas_library / solver_library: the BLAS and LAPACK-solver libraries the quant
  // engine loads; "" = the backend's default.
  const char* blas_library;
  const char* solver_library;
} qlink_backend_options;  // every string NUL-terminated, never NULL, borrowed for the call

// The two symbols a backend library exports, and nothing else (backends/backend.lds).
#define QLINK_BACKEND_VERSION_SYMBOL "qlink_backend_interface_version"
#define QLINK_BACKEND_CREATE_SYMBOL "qlink_backend_create"
// The QLINK_BACKEND_INTERFACE_VERSION the library was built with.
typedef uint32_t qlink_backend_version_fn(void);
// A new backend owned by the caller, or NULL with the reason, NUL-terminated, in
// error[0, error_capacity).
typedef qlink::DeviceBackend* qlink_backend_create_fn(const qlink_backend_options* options, char* error,
                                                      size_t error_capacity);

}  // extern "C"

namespace qlink {
namespace internal {

inline void WriteBackendError(const std::string& message, char* error, size_t capacity) {
  if (error == nullptr || capacity == 0) return;
  const size_t n = std::min(message.size(), capacity - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// The factory's side of the boundary: an options struct of another size is refused, and
// a refusal or an exception comes back as text in the caller's buffer.
template <typename Create>
DeviceBackend* CreateBackend(Create create, const qlink_backend_options* options, char* error, size_t capacity) {
  try {
    if (options == nullptr) {
      WriteBackendError("options is NULL", error, capacity);
      return nullptr;
    }
    if (options->struct_size != sizeof(qlink_backend_options)) {
      WriteBackendError("options->struct_size " + std::to_string(options->struct_size) + " is not this backend's " +
                            std::to_string(sizeof(qlink_backend_options)),
                        error, capacity);
      return nullptr;
    }
    std::unique_ptr<DeviceBackend> backend;
    Status s = create(*options, &backend);
    if (!s.ok()) {
      WriteBackendError(s.message(), error, capacity);
      return nullptr;
    }
    return backend.release();
  } catch (const std::exception& e) {
    WriteBackendError(std::string("unexpected exception: ") + e.what(), error, capacity);
  } catch (...) {
    WriteBackendError("unexpected non-standard exception", error, capacity);
  }
  return nullptr;
}

}  // namespace internal
}  // namespace qlink

// Defines a backend library's two exports around
// `qlink::Status create(const qlink_backend_options&, std::unique_ptr<qlink::DeviceBackend>*)`.
#define QLINK_EXPORT_BACKEND(create)                                                                       \
  extern "C" uint32_t qlink_backend_interface_version(void) { return QLINK_BACKEND_INTERFACE_VERSION; }    \
  extern "C" qlink::DeviceBackend* qlink_backend_create(const qlink_backend_options* options, char* error, \
                                                        size_t error_capacity) {                           \
    return qlink::internal::CreateBackend(create, options, error, error_capacity);                         \
  }
