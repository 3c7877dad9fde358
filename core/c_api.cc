// The C ABI: qlink_get_api and the function table behind it. Every entry point turns a
// Status (or an escaping exception) into a qlink_status plus this thread's message.
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/communicator.h"
#include "core/context.h"
#include "core/copy_plan.h"
#include "core/link_probe.h"
#include "core/tensor_check.h"
#include "plugin_api/qlink.h"
#include "quant/gptq/gptq_quantize.h"

struct qlink_context {
  std::unique_ptr<qlink::Context> impl;
};

struct qlink_comm {
  std::unique_ptr<qlink::Communicator> impl;
};

namespace qlink {
// A prepared plan as the ABI hands it out: the plan and the context it belongs to.
template <typename Plan>
struct PlanHandle {
  Context* ctx = nullptr;
  Plan plan;
};
}  // namespace qlink

struct qlink_copy_plan : qlink::PlanHandle<qlink::CopyPlan> {};
struct qlink_all_reduce_plan : qlink::PlanHandle<qlink::AllReducePlan> {};

namespace qlink {
namespace {

thread_local std::string last_error;

template <typename F>
qlink_status Guard(F&& body) {
  Status s;
  try {
    s = body();
  } catch (const std::bad_alloc&) {
    s = OutOfMemory("host memory exhausted");
  } catch (const std::exception& e) {
    s = Internal(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    s = Internal("unexpected non-standard exception");
  }
  last_error = s.message();
  return s.code();
}

Status CheckNotNull(const void* p, const char* what) {
  return p == nullptr ? InvalidArgument(std::string(what) + " is NULL") : Status::Ok();
}

// Copies `full` into the caller's struct, no byte past the struct_size it set.
template <typename T>
Status WriteVersioned(const T& full, T* out, size_t min_size, const char* what) {
  QLINK_RETURN_IF_ERROR(CheckNotNull(out, what));
  const size_t caller_size = out->struct_size;
  QLINK_RETURN_IF_ERROR(CheckStructSize(caller_size, min_size, what, "1.0"));
  std::memcpy(out, &full, std::min(caller_size, sizeof(T)));
  out->struct_size = caller_size;
  return Status::Ok();
}

void CopyString(const std::string& from, char* to, size_t capacity) {
  size_t n = std::min(from.size(), capacity - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

const char* LastError() { return last_error.c_str(); }

qlink_status ContextCreate(const char* config_json, qlink_context** out) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(out, "out"));
    *out = nullptr;
    auto handle = std::make_unique<qlink_context>();
    QLINK_RETURN_IF_ERROR(Context::Create(config_json, &handle->impl));
    *out = handle.release();
    return Status::Ok();
  });
}

qlink_status ContextDestroy(qlink_context* ctx) {
  return Guard([&] {
    delete ctx;
    return Status::Ok();
  });
}

qlink_status BackendName(const qlink_context* ctx, const char** name) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    *name = ctx->impl->backend().name();
    return Status::Ok();
  });
}

qlink_status DeviceCount(const qlink_context* ctx, int32_t* count) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(count, "count"));
    *count = ctx->impl->backend().device_count();
    return Status::Ok();
  });
}

qlink_status DeviceInfo(const qlink_context* ctx, int32_t device, qlink_device_info* info) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(const_cast<DeviceBackend&>(ctx->impl->backend()));
    QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(device, "device"));
    DeviceBackend& backend = const_cast<DeviceBackend&>(ctx->impl->backend());
    DeviceProperties props;
    QLINK_RETURN_IF_ERROR(backend.GetProperties(device, &props));
    qlink_device_info full{};
    full.struct_size = sizeof(full);
    full.device = DLDevice{backend.device_type(), device};
    CopyString(props.name, full.name, sizeof(full.name));
    full.total_bytes = props.total_bytes;
    full.free_bytes = props.free_bytes;
    return WriteVersioned(full, info, QLINK_DEVICE_INFO_STRUCT_SIZE_1_0, "info");
  });
}

qlink_status EnablePeerAccess(qlink_context* ctx, const int32_t* devices, size_t num_devices) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    if (num_devices > 0) QLINK_RETURN_IF_ERROR(CheckNotNull(devices, "devices"));
    std::vector<int> list;
    for (size_t i = 0; i < num_devices; ++i) {
      std::string what = "devices[" + std::to_string(i) + "]";
      QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(devices[i], what.c_str()));
      if (std::find(list.begin(), list.end(), devices[i]) != list.end()) {
        return InvalidArgument(what + " = " + std::to_string(devices[i]) + " is listed twice");
      }
      list.push_back(devices[i]);
    }
    return ctx->impl->topology().EnablePeerAccess(list);
  });
}

qlink_status PeerInfo(const qlink_context* ctx, int32_t src, int32_t dst, qlink_peer_info* info) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(src, "src_device"));
    QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(dst, "dst_device"));
    PeerState p = ctx->impl->topology().Get(src, dst);
    qlink_peer_info full{};
    full.struct_size = sizeof(full);
    full.src_device = src;
    full.dst_device = dst;
    full.state = p.state;
    full.probed = p.probed ? 1 : 0;
    full.peer_gbps = p.peer_gbps;
    full.regular_gbps = p.regular_gbps;
    CopyString(p.reason, full.reason, sizeof(full.reason));
    return WriteVersioned(full, info, QLINK_PEER_INFO_STRUCT_SIZE_1_0, "info");
  });
}

qlink_status MeasureLink(qlink_context* ctx, int32_t src, int32_t dst, uint64_t bytes, qlink_link_measurement* out) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    Context& c = *ctx->impl;
    DeviceRestore restore(c.backend());
    QLINK_RETURN_IF_ERROR(c.CheckDevice(src, "src_device"));
    QLINK_RETURN_IF_ERROR(c.CheckDevice(dst, "dst_device"));
    if (bytes == 0 || bytes > (uint64_t{16} << 30)) {
      return InvalidArgument("bytes = " + std::to_string(bytes) + " is out of range [1, 16 GiB]");
    }
    const bool peer = src != dst && c.topology().PeerEnabled(src, dst);
    const uint64_t small = 4096;
    auto path_for = [&](uint64_t n) {
      return (src == dst || peer) && n < c.backend().PullCrossoverBytes() ? CopyPath::kPull : CopyPath::kRuntime;
    };
    double big_s = 0, small_s = 0;
    QLINK_RETURN_IF_ERROR(TimeCopy(c.backend(), src, dst, bytes, path_for(bytes), 10, &big_s));
    QLINK_RETURN_IF_ERROR(TimeCopy(c.backend(), src, dst, small, path_for(small), 50, &small_s));
    qlink_link_measurement full{};
    full.struct_size = sizeof(full);
    full.bytes = bytes;
    full.gbps = Gbps(bytes, big_s);
    full.latency_us = small_s * 1e6;
    full.used_peer = peer ? 1 : 0;
    return WriteVersioned(full, out, QLINK_LINK_MEASUREMENT_STRUCT_SIZE_1_0, "out");
  });
}

qlink_status CopyBatch(qlink_context* ctx, const qlink_copy_args* args) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    CopyPlan plan;
    QLINK_RETURN_IF_ERROR(CopyPlan::Build(*ctx->impl, args, &plan));
    return plan.Execute(*ctx->impl, args->streams, args->num_streams);
  });
}

// Validates and plans once; copy plans also lay their pulled leaves out on the devices.
Status MakePlan(Context& ctx, const qlink_copy_args* args, CopyPlan* plan) {
  QLINK_RETURN_IF_ERROR(CopyPlan::Build(ctx, args, plan));
  return plan->Prepare(ctx);
}
Status MakePlan(Context& ctx, const qlink_all_reduce_args* args, AllReducePlan* plan) {
  return AllReducePlan::Build(ctx, args, plan);
}

template <typename Handle, typename Args>
qlink_status PlanCreate(qlink_context* ctx, const Args* args, Handle** out) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(out, "plan"));
    *out = nullptr;
    DeviceRestore restore(ctx->impl->backend());  // outlives `handle`, which may free device memory
    auto handle = std::make_unique<Handle>();
    handle->ctx = ctx->impl.get();
    QLINK_RETURN_IF_ERROR(MakePlan(*ctx->impl, args, &handle->plan));
    *out = handle.release();
    return Status::Ok();
  });
}

template <typename Handle>
qlink_status PlanExecute(Handle* plan, const qlink_stream* streams, size_t num_streams) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(plan, "plan"));
    DeviceRestore restore(plan->ctx->backend());
    QLINK_RETURN_IF_ERROR(CheckStreams(*plan->ctx, streams, num_streams));
    return plan->plan.Execute(*plan->ctx, streams, num_streams);
  });
}

template <typename Handle>
qlink_status PlanDestroy(Handle* plan) {
  return Guard([&] {
    if (plan == nullptr) return Status::Ok();
    DeviceRestore restore(plan->ctx->backend());  // prepared pulls free device memory
    delete plan;
    return Status::Ok();
  });
}

qlink_status MemoryAllocate(qlink_context* ctx, int32_t device, uint64_t bytes, void** ptr) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    QLINK_RETURN_IF_ERROR(CheckNotNull(ptr, "ptr"));
    QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(device, "device"));
    *ptr = nullptr;
    return ctx->impl->backend().Allocate(device, bytes, ptr);
  });
}

qlink_status MemoryFree(qlink_context* ctx, int32_t device, void* ptr) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(device, "device"));
    if (ptr != nullptr) ctx->impl->backend().Free(device, ptr);
    return Status::Ok();
  });
}

Status CheckHostTransfer(qlink_context* ctx, int32_t device, const void* dst, const void* src, uint64_t bytes) {
  QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
  QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(device, "device"));
  if (bytes > 0) {
    QLINK_RETURN_IF_ERROR(CheckNotNull(dst, "dst"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(src, "src"));
  }
  return Status::Ok();
}

qlink_status MemoryToHost(qlink_context* ctx, int32_t device, void* host_dst, const void* device_src,
                          uint64_t bytes) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckHostTransfer(ctx, device, host_dst, device_src, bytes));
    DeviceRestore restore(ctx->impl->backend());
    return bytes == 0 ? Status::Ok() : ctx->impl->backend().CopyToHost(device, host_dst, device_src, bytes);
  });
}

qlink_status MemoryFromHost(qlink_context* ctx, int32_t device, void* device_dst, const void* host_src,
                            uint64_t bytes) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckHostTransfer(ctx, device, device_dst, host_src, bytes));
    DeviceRestore restore(ctx->impl->backend());
    return bytes == 0 ? Status::Ok() : ctx->impl->backend().CopyFromHost(device, device_dst, host_src, bytes);
  });
}

qlink_status StreamSynchronize(qlink_context* ctx, int32_t device, void* stream) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    QLINK_RETURN_IF_ERROR(ctx->impl->CheckDevice(device, "device"));
    return ctx->impl->backend().SynchronizeStream(device, stream);
  });
}

qlink_status BroadcastEntry(qlink_context* ctx, const qlink_broadcast_args* args) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    return Broadcast(*ctx->impl, args);
  });
}

qlink_status ReduceEntry(qlink_context* ctx, const qlink_reduce_args* args) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    return Reduce(*ctx->impl, args);
  });
}

qlink_status AllReduceEntry(qlink_context* ctx, const qlink_all_reduce_args* args) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    return AllReduce(*ctx->impl, args);
  });
}

qlink_status CommUniqueId(qlink_context* ctx, qlink_unique_id* out) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(out, "out"));
    return Communicator::UniqueId(*ctx->impl, out);
  });
}

qlink_status CommCreate(qlink_context* ctx, const qlink_unique_id* id, int32_t nranks, int32_t rank, int32_t device,
                        qlink_comm** out) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(id, "id"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(out, "comm"));
    *out = nullptr;
    DeviceRestore restore(ctx->impl->backend());
    auto handle = std::make_unique<qlink_comm>();
    QLINK_RETURN_IF_ERROR(Communicator::Create(*ctx->impl, *id, nranks, rank, device, &handle->impl));
    *out = handle.release();
    return Status::Ok();
  });
}

qlink_status CommDestroy(qlink_comm* comm) {
  return Guard([&] {
    if (comm != nullptr) {
      DeviceRestore restore(comm->impl->context().backend());
      comm->impl.reset();
    }
    delete comm;
    return Status::Ok();
  });
}

template <typename F>
qlink_status OnComm(qlink_comm* comm, F&& body) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(comm, "comm"));
    DeviceRestore restore(comm->impl->context().backend());
    return body(*comm->impl);
  });
}

qlink_status CommAllReduce(qlink_comm* comm, const DLTensor* buffer, int32_t op, void* stream) {
  return OnComm(comm, [&](Communicator& c) { return c.AllReduce(buffer, op, stream); });
}

qlink_status CommBroadcast(qlink_comm* comm, const DLTensor* buffer, int32_t root, void* stream) {
  return OnComm(comm, [&](Communicator& c) { return c.Broadcast(buffer, root, stream); });
}

qlink_status CommReduce(qlink_comm* comm, const DLTensor* buffer, int32_t root, double scale, void* stream) {
  return OnComm(comm, [&](Communicator& c) { return c.Reduce(buffer, root, scale, stream); });
}

qlink_status HessianAccumulateEntry(qlink_context* ctx, const qlink_hessian_args* args) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    return quant::HessianAccumulate(*ctx->impl, args);
  });
}

qlink_status GptqQuantizeEntry(qlink_context* ctx, qlink_gptq_args* args) {
  return Guard([&] {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ctx, "ctx"));
    DeviceRestore restore(ctx->impl->backend());
    return quant::GptqQuantize(*ctx->impl, args);
  });
}

const qlink_api kApi = {
    sizeof(qlink_api),
    QLINK_ABI_MAJOR,
    QLINK_ABI_MINOR,
    &LastError,
    &ContextCreate,
    &ContextDestroy,
    &BackendName,
    &DeviceCount,
    &DeviceInfo,
    &EnablePeerAccess,
    &PeerInfo,
    &MeasureLink,
    &CopyBatch,
    &PlanCreate<qlink_copy_plan, qlink_copy_args>,
    &PlanExecute<qlink_copy_plan>,
    &PlanDestroy<qlink_copy_plan>,
    &MemoryAllocate,
    &MemoryFree,
    &MemoryToHost,
    &MemoryFromHost,
    &StreamSynchronize,
    &BroadcastEntry,
    &ReduceEntry,
    &AllReduceEntry,
    &CommUniqueId,
    &CommCreate,
    &CommDestroy,
    &CommAllReduce,
    &CommBroadcast,
    &CommReduce,
    &PlanCreate<qlink_all_reduce_plan, qlink_all_reduce_args>,
    &PlanExecute<qlink_all_reduce_plan>,
    &PlanDestroy<qlink_all_reduce_plan>,
    &HessianAccumulateEntry,
    &GptqQuantizeEntry,
};

}  // namespace
}  // namespace qlink

extern "C" const qlink_api* qlink_get_api(uint32_t major, uint32_t min_minor, const char** error) {
  if (major == QLINK_ABI_MAJOR && min_minor <= QLINK_ABI_MINOR) {
    qlink::last_error.clear();
    return &qlink::kApi;
  }
  qlink::last_error = "libqlink provides ABI " + std::to_string(QLINK_ABI_MAJOR) + "." +
                      std::to_string(QLINK_ABI_MINOR) + ", the host asked for " + std::to_string(major) + "." +
                      std::to_string(min_minor) + (major != QLINK_ABI_MAJOR ? " (major differs)" : " (minor too new)");
  if (error != nullptr) *error = qlink::last_error.c_str();
  return nullptr;
}
