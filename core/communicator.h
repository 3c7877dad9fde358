// Collectives across processes and nodes over NCCL (RCCL on HIP), one rank per
// communicator; the host distributes the unique id (e.g. through torch.distributed's
// store). Semantics match the in-process collectives: op sum / avg / sign-cast.
#pragma once

#include <memory>
#include <mutex>

#include "core/context.h"
#include "core/nccl_api.h"
#include "core/tensor_check.h"

namespace qlink {

class Communicator {
 public:
  static Status UniqueId(Context& ctx, qlink_unique_id* out);
  static Status Create(Context& ctx, const qlink_unique_id& id, int nranks, int rank, int device,
                       std::unique_ptr<Communicator>* out);
  ~Communicator();

  Status AllReduce(const DLTensor* buffer, int op, Stream stream);
  Status Broadcast(const DLTensor* buffer, int root, Stream stream);
  Status Reduce(const DLTensor* buffer, int root, double scale, Stream stream);

  Context& context() { return ctx_; }

 private:
  Communicator(Context& ctx, const NcclApi& nccl, int nranks, int rank, int device)
      : ctx_(ctx), nccl_(nccl), nranks_(nranks), rank_(rank), device_(device) {}
  // Checks `buffer` lives on this rank's device (and is fp32 when `fp32`); gives its size.
  Status CheckBuffer(const DLTensor* buffer, bool fp32, uint64_t* bytes) const;
  Status SignAllReduce(float* data, size_t count, Stream stream);
  // Checks `buffer`, then runs body(data, bytes) with this rank's device current, one call
  // at a time per communicator. Empty buffers are done before any NCCL call.
  template <typename Body>
  Status OnBuffer(const DLTensor* buffer, bool fp32, Body&& body) {
    uint64_t bytes = 0;
    QLINK_RETURN_IF_ERROR(CheckBuffer(buffer, fp32, &bytes));
    if (bytes == 0) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    ctx_.backend().MakeCurrent(device_);
    return body(const_cast<char*>(TensorBytes(*buffer)), bytes);
  }

  Context& ctx_;
  const NcclApi& nccl_;
  const int nranks_, rank_, device_;
  NcclApi::Comm comm_ = nullptr;
  std::mutex mu_;  // a communicator takes one call at a time
};

}  // namespace qlink
