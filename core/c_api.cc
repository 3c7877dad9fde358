// The C ABI: qlink_get_api and the function table behind it. Each entry point checks its
// own arguments and calls core; what they all do around that is in entry_point.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/entry_point.h"
#include "core/link_probe.h"
#include "core/stream_list.h"
#include "plugin_api/qlink.h"
#include "quant/gptq/gptq_quantize.h"
#include "quant/gptq/hessian_accumulate.h"
#include "quant/signround/signround.h"
#include "quant/signround/signround_experts.h"

namespace qlink {
namespace {

qlink_status ContextCreate(const char* config_json, qlink_context** out) {
  return Guard(
      [&] { return MakeHandle(out, "out", [&](qlink_context& h) { return Context::Create(config_json, &h.impl); }); });
}

// The context's own destructor restores the host's device: its backend goes with it.
qlink_status ContextDestroy(qlink_context* ctx) {
  return Guard([&] {
    delete ctx;
    return Status::Ok();
  });
}

qlink_status BackendName(const qlink_context* ctx, const char** name) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    *name = c.backend().name();
    return Status::Ok();
  });
}

qlink_status DeviceCount(const qlink_context* ctx, int32_t* count) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(CheckNotNull(count, "count"));
    *count = c.backend().device_count();
    return Status::Ok();
  });
}

void CopyString(const std::string& from, char* to, size_t capacity) {
  size_t n = std::min(from.size(), capacity - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

qlink_status DeviceInfo(const qlink_context* ctx, int32_t device, qlink_device_info* info) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(c.CheckDevice(device, "device"));
    DeviceProperties props;
    QLINK_RETURN_IF_ERROR(c.backend().GetProperties(device, &props));
    qlink_device_info full{};
    full.struct_size = sizeof(full);
    full.device = DLDevice{c.backend().device_type(), device};
    CopyString(props.name, full.name, sizeof(full.name));
    full.total_bytes = props.total_bytes;
    full.free_bytes = props.free_bytes;
    return WriteVersioned(full, info, QLINK_DEVICE_INFO_STRUCT_SIZE_1_0, "info");
  });
}

qlink_status EnablePeerAccess(qlink_context* ctx, const int32_t* devices, size_t num_devices) {
  return OnContext(ctx, [&](Context& c) {
    if (num_devices > 0) QLINK_RETURN_IF_ERROR(CheckNotNull(devices, "devices"));
    std::vector<int> list;
    for (size_t i = 0; i < num_devices; ++i) {
      std::string what = "devices[" + std::to_string(i) + "]";
      QLINK_RETURN_IF_ERROR(c.CheckDevice(devices[i], what.c_str()));
      if (std::find(list.begin(), list.end(), devices[i]) != list.end()) {
        return InvalidArgument(what + " = " + std::to_string(devices[i]) + " is listed twice");
      }
      list.push_back(devices[i]);
    }
    return c.topology().EnablePeerAccess(list);
  });
}

qlink_status PeerInfo(const qlink_context* ctx, int32_t src, int32_t dst, qlink_peer_info* info) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(c.CheckDevice(src, "src_device"));
    QLINK_RETURN_IF_ERROR(c.CheckDevice(dst, "dst_device"));
    PeerState p = c.topology().Get(src, dst);
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
  return OnContext(ctx, [&](Context& c) {
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
  return OnContext(ctx, [&](Context& c) {
    CopyPlan plan;
    QLINK_RETURN_IF_ERROR(CopyPlan::Build(c, args, &plan));
    return plan.Execute(c, args->streams, args->num_streams);
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
  return OnContext(ctx, [&](Context& c) {
    return MakeHandle(out, "plan", [&](Handle& h) {
      h.ctx = &c;
      return MakePlan(c, args, &h.plan);
    });
  });
}

template <typename Handle>
qlink_status PlanExecute(Handle* plan, const qlink_stream* streams, size_t num_streams) {
  return OnHandle(plan, "plan", [&](Handle& h) {
    QLINK_RETURN_IF_ERROR(CheckStreams(*h.ctx, streams, num_streams));
    return h.plan.Execute(*h.ctx, streams, num_streams);
  });
}

qlink_status MemoryAllocate(qlink_context* ctx, int32_t device, uint64_t bytes, void** ptr) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(CheckNotNull(ptr, "ptr"));
    QLINK_RETURN_IF_ERROR(c.CheckDevice(device, "device"));
    *ptr = nullptr;
    return c.backend().Allocate(device, bytes, ptr);
  });
}

qlink_status MemoryFree(qlink_context* ctx, int32_t device, void* ptr) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(c.CheckDevice(device, "device"));
    if (ptr != nullptr) c.backend().Free(device, ptr);
    return Status::Ok();
  });
}

// A synchronous host transfer of `bytes` between `device` and host memory.
template <typename Transfer>
qlink_status HostTransfer(qlink_context* ctx, int32_t device, void* dst, const void* src, uint64_t bytes,
                          Transfer transfer) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(c.CheckDevice(device, "device"));
    if (bytes == 0) return Status::Ok();
    QLINK_RETURN_IF_ERROR(CheckNotNull(dst, "dst"));
    QLINK_RETURN_IF_ERROR(CheckNotNull(src, "src"));
    return (c.backend().*transfer)(device, dst, src, bytes);
  });
}

qlink_status MemoryToHost(qlink_context* ctx, int32_t device, void* host_dst, const void* device_src, uint64_t bytes) {
  return HostTransfer(ctx, device, host_dst, device_src, bytes, &DeviceBackend::CopyToHost);
}

qlink_status MemoryFromHost(qlink_context* ctx, int32_t device, void* device_dst, const void* host_src,
                            uint64_t bytes) {
  return HostTransfer(ctx, device, device_dst, host_src, bytes, &DeviceBackend::CopyFromHost);
}

qlink_status StreamSynchronize(qlink_context* ctx, int32_t device, void* stream) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(c.CheckDevice(device, "device"));
    return c.backend().SynchronizeStream(device, stream);
  });
}

qlink_status BroadcastEntry(qlink_context* ctx, const qlink_broadcast_args* args) {
  return OnContext(ctx, [&](Context& c) { return Broadcast(c, args); });
}

qlink_status ReduceEntry(qlink_context* ctx, const qlink_reduce_args* args) {
  return OnContext(ctx, [&](Context& c) { return Reduce(c, args); });
}

qlink_status AllReduceEntry(qlink_context* ctx, const qlink_all_reduce_args* args) {
  return OnContext(ctx, [&](Context& c) { return AllReduce(c, args); });
}

qlink_status CommUniqueId(qlink_context* ctx, qlink_unique_id* out) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(CheckNotNull(out, "out"));
    return Communicator::UniqueId(c, out);
  });
}

qlink_status CommCreate(qlink_context* ctx, const qlink_unique_id* id, int32_t nranks, int32_t rank, int32_t device,
                        qlink_comm** out) {
  return OnContext(ctx, [&](Context& c) {
    QLINK_RETURN_IF_ERROR(CheckNotNull(id, "id"));
    return MakeHandle(out, "comm",
                      [&](qlink_comm& h) { return Communicator::Create(c, *id, nranks, rank, device, &h.impl); });
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
  return OnContext(ctx, [&](Context& c) { return quant::HessianAccumulate(c, args); });
}

qlink_status GptqQuantizeEntry(qlink_context* ctx, qlink_gptq_args* args) {
  return OnContext(ctx, [&](Context& c) { return quant::GptqQuantize(c, args); });
}

qlink_status SignRoundQdqEntry(qlink_context* ctx, const qlink_signround_args* args) {
  return OnContext(ctx, [&](Context& c) { return quant::SignRoundQdq(c, args, quant::SignRoundPass::kForward); });
}

qlink_status SignRoundQdqBackwardEntry(qlink_context* ctx, const qlink_signround_args* args) {
  return OnContext(ctx, [&](Context& c) { return quant::SignRoundQdq(c, args, quant::SignRoundPass::kBackward); });
}

qlink_status SignSgdStepEntry(qlink_context* ctx, const qlink_signsgd_args* args) {
  return OnContext(ctx, [&](Context& c) { return quant::SignSgd(c, args); });
}

qlink_status SignRoundExpertsQdqEntry(qlink_context* ctx, const qlink_signround_experts_args* args) {
  return OnContext(ctx,
                   [&](Context& c) { return quant::SignRoundExpertsQdq(c, args, quant::SignRoundPass::kForward); });
}

qlink_status SignRoundExpertsQdqBackwardEntry(qlink_context* ctx, const qlink_signround_experts_args* args) {
  return OnContext(ctx,
                   [&](Context& c) { return quant::SignRoundExpertsQdq(c, args, quant::SignRoundPass::kBackward); });
}

qlink_status SignSgdExpertsStepEntry(qlink_context* ctx, const qlink_signsgd_experts_args* args) {
  return OnContext(ctx, [&](Context& c) { return quant::SignSgdExperts(c, args); });
}

const char* LastError() { return LastErrorOfThread().c_str(); }

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
    &DestroyHandle<qlink_copy_plan>,
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
    &DestroyHandle<qlink_comm>,
    &CommAllReduce,
    &CommBroadcast,
    &CommReduce,
    &PlanCreate<qlink_all_reduce_plan, qlink_all_reduce_args>,
    &PlanExecute<qlink_all_reduce_plan>,
    &DestroyHandle<qlink_all_reduce_plan>,
    &HessianAccumulateEntry,
    &GptqQuantizeEntry,
    &SignRoundQdqEntry,
    &SignRoundQdqBackwardEntry,
    &SignSgdStepEntry,
    &SignRoundExpertsQdqEntry,
    &SignRoundExpertsQdqBackwardEntry,
    &SignSgdExpertsStepEntry,
};

}  // namespace
}  // namespace qlink

extern "C" const qlink_api* qlink_get_api(uint32_t major, uint32_t min_minor, const char** error) {
  if (major == QLINK_ABI_MAJOR && min_minor <= QLINK_ABI_MINOR) {
    qlink::LastErrorOfThread().clear();
    return &qlink::kApi;
  }
  std::string& message = qlink::LastErrorOfThread();
  message = "libqlink provides ABI " + std::to_string(QLINK_ABI_MAJOR) + "." + std::to_string(QLINK_ABI_MINOR) +
            ", the host asked for " + std::to_string(major) + "." + std::to_string(min_minor) +
            (major != QLINK_ABI_MAJOR ? " (major differs)" : " (minor too new)");
  if (error != nullptr) *error = message.c_str();
  return nullptr;
}
