#include "core/communicator.h"

#include <cmath>
#include <cstring>

#include "core/tensor_check.h"

namespace qlink {
namespace {

Status LoadFor(Context& ctx, const NcclApi** out) {
  std::string library = ctx.config().nccl_library;
  if (library.empty()) {
    const std::string backend = ctx.backend().name();
    if (backend == "cuda")
      library = "libnccl.so.2";
    else if (backend == "hip")
      library = "librccl.so.1";
    else
      return Unavailable("the " + backend + " backend has no NCCL transport: it connects GPUs of CUDA or HIP");
  }
  return LoadNccl(library, out);
}

}  // namespace

Status Communicator::UniqueId(Context& ctx, qlink_unique_id* out) {
  const NcclApi* nccl = nullptr;
  QLINK_RETURN_IF_ERROR(LoadFor(ctx, &nccl));
  NcclApi::UniqueId id;
  QLINK_RETURN_IF_ERROR(nccl->Check(nccl->GetUniqueId(&id), "ncclGetUniqueId"));
  static_assert(sizeof(id.internal) == sizeof(out->bytes), "unique id sizes differ");
  std::memcpy(out->bytes, id.internal, sizeof(out->bytes));
  return Status::Ok();
}

Status Communicator::Create(Context& ctx, const qlink_unique_id& id, int nranks, int rank, int device,
                            std::unique_ptr<Communicator>* out) {
  if (nranks < 1) return InvalidArgument("nranks = " + std::to_string(nranks) + " must be >= 1");
  if (rank < 0 || rank >= nranks) {
    return InvalidArgument("rank = " + std::to_string(rank) + " is outside [0, nranks = " + std::to_string(nranks) +
                           ")");
  }
  QLINK_RETURN_IF_ERROR(ctx.CheckDevice(device, "device"));
  const NcclApi* nccl = nullptr;
  QLINK_RETURN_IF_ERROR(LoadFor(ctx, &nccl));
  std::unique_ptr<Communicator> c(new Communicator(ctx, *nccl, nranks, rank, device));
  NcclApi::UniqueId nid;
  std::memcpy(nid.internal, id.bytes, sizeof(nid.internal));
  ctx.backend().MakeCurrent(device);  // NCCL binds the communicator to the current device
  QLINK_RETURN_IF_ERROR(nccl->Check(nccl->CommInitRank(&c->comm_, nranks, nid, rank), "ncclCommInitRank"));
  *out = std::move(c);
  return Status::Ok();
}

Communicator::~Communicator() {
  if (comm_ != nullptr) nccl_.CommDestroy(comm_);
}

Status Communicator::CheckBuffer(const DLTensor* buffer, bool fp32, uint64_t* bytes) const {
  if (buffer == nullptr) return InvalidArgument("buffer is NULL");
  const DeviceBackend& b = ctx_.backend();
  QLINK_RETURN_IF_ERROR(CheckTensor(*buffer, "buffer", 0, b.device_type(), b.device_count(), bytes));
  if (buffer->device.device_id != device_) {
    return InvalidArgument("buffer[0] is on device " + std::to_string(buffer->device.device_id) +
                           ", not this rank's device " + std::to_string(device_));
  }
  if (fp32 && !(buffer->dtype.code == kDLFloat && buffer->dtype.bits == 32 && buffer->dtype.lanes == 1)) {
    return InvalidArgument("buffer[0]: dtype must be float32");
  }
  return Status::Ok();
}

Status Communicator::AllReduce(const DLTensor* buffer, int op, Stream stream) {
  if (op < QLINK_REDUCE_SUM || op > QLINK_REDUCE_SIGN) {
    return InvalidArgument("op = " + std::to_string(op) + " is not a qlink_reduce_op");
  }
  return OnBuffer(buffer, true, [&](char* bytes_at, uint64_t bytes) {
    float* data = reinterpret_cast<float*>(bytes_at);
    if (op == QLINK_REDUCE_SIGN) return SignAllReduce(data, bytes / 4, stream);
    return nccl_.Check(nccl_.AllReduce(data, data, bytes / 4, NcclApi::kFloat32,
                                       op == QLINK_REDUCE_AVG ? NcclApi::kAvg : NcclApi::kSum, comm_, stream),
                       "ncclAllReduce");
  });
}

// docs/HOSTS.md's sign-cast: reduce-scatter, sign of the owned chunk as int8, all-gather of
// the signs; every rank then applies bit-identical values.
Status Communicator::SignAllReduce(float* data, size_t count, Stream stream) {
  DeviceBackend& b = ctx_.backend();
  const size_t chunk = (count + nranks_ - 1) / nranks_, padded = chunk * nranks_;
  BorrowedScratch scratch(ctx_.scratch());
  void* sums = nullptr;
  void* signs = nullptr;
  QLINK_RETURN_IF_ERROR(scratch.Take(device_, padded * 4, stream, &sums));
  QLINK_RETURN_IF_ERROR(scratch.Take(device_, padded, stream, &signs));
  float* partial = static_cast<float*>(sums);
  int8_t* sign = static_cast<int8_t*>(signs);
  const CopyLeaf leaf{data, partial, count * 4};
  QLINK_RETURN_IF_ERROR(b.CopyLeaves(device_, device_, &leaf, 1, stream));
  if (padded > count) QLINK_RETURN_IF_ERROR(b.Memset(device_, partial + count, 0, (padded - count) * 4, stream));
  QLINK_RETURN_IF_ERROR(nccl_.Check(
      nccl_.ReduceScatter(partial, partial + rank_ * chunk, chunk, NcclApi::kFloat32, NcclApi::kSum, comm_, stream),
      "ncclReduceScatter"));
  const void* owned = partial + rank_ * chunk;
  QLINK_RETURN_IF_ERROR(b.ReduceSum(device_, sign + rank_ * chunk, &owned, 1, false, chunk, 1.0f, true, stream));
  QLINK_RETURN_IF_ERROR(
      nccl_.Check(nccl_.AllGather(sign + rank_ * chunk, sign, chunk, NcclApi::kInt8, comm_, stream), "ncclAllGather"));
  QLINK_RETURN_IF_ERROR(b.ExpandSigns(device_, data, sign, count, stream));
  return scratch.GiveBack();
}

Status Communicator::Broadcast(const DLTensor* buffer, int root, Stream stream) {
  if (root < 0 || root >= nranks_) return InvalidArgument("root = " + std::to_string(root) + " is not a rank");
  return OnBuffer(buffer, false, [&](char* data, uint64_t bytes) {
    return nccl_.Check(nccl_.Broadcast(data, data, bytes, NcclApi::kInt8, root, comm_, stream), "ncclBroadcast");
  });
}

Status Communicator::Reduce(const DLTensor* buffer, int root, double scale, Stream stream) {
  if (root < 0 || root >= nranks_) return InvalidArgument("root = " + std::to_string(root) + " is not a rank");
  if (!std::isfinite(scale)) return InvalidArgument("scale is not finite");
  return OnBuffer(buffer, true, [&](char* bytes_at, uint64_t bytes) {
    float* data = reinterpret_cast<float*>(bytes_at);
    QLINK_RETURN_IF_ERROR(nccl_.Check(
        nccl_.Reduce(data, data, bytes / 4, NcclApi::kFloat32, NcclApi::kSum, root, comm_, stream), "ncclReduce"));
    if (rank_ != root || scale == 1.0) return Status::Ok();
    const void* in = data;
    return ctx_.backend().ReduceSum(device_, data, &in, 1, false, bytes / 4, static_cast<float>(scale), false, stream);
  });
}

}  // namespace qlink
