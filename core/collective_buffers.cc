#include "core/collective_buffers.h"

#include <algorithm>
#include <string>

#include "core/tensor_check.h"

namespace qlink {

Status CheckFp32(const DLTensor& t, const char* side, size_t i) {
  if (t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1) return Status::Ok();
  return InvalidArgument(ArgName(side, i) + ": dtype must be float32, got code " + std::to_string(t.dtype.code) +
                         " with " + std::to_string(t.dtype.bits) + " bits x " + std::to_string(t.dtype.lanes) +
                         " lanes");
}

Status CheckPerDevice(const Context& ctx, const DLTensor* t, size_t n, const char* side, uint64_t* bytes,
                      std::vector<size_t>* order) {
  if (n == 0) return InvalidArgument(std::string(side) + " is empty");
  if (t == nullptr) return InvalidArgument(std::string(side) + " is NULL");
  if (n > kMaxParticipants) {
    return InvalidArgument(std::string(side) + " has " + std::to_string(n) + " buffers; at most " +
                           std::to_string(kMaxParticipants));
  }
  const DeviceBackend& b = ctx.backend();
  for (size_t i = 0; i < n; ++i) {
    uint64_t got = 0;
    QLINK_RETURN_IF_ERROR(CheckTensor(t[i], side, i, b.device_type(), b.device_count(), &got));
    QLINK_RETURN_IF_ERROR(CheckFp32(t[i], side, i));
    if (i == 0) *bytes = got;
    if (got != *bytes) {
      return InvalidArgument(ArgName(side, i) + " has " + std::to_string(got) + " bytes but " + ArgName(side, 0) +
                             " has " + std::to_string(*bytes));
    }
  }
  order->resize(n);
  for (size_t i = 0; i < n; ++i) (*order)[i] = i;
  std::sort(order->begin(), order->end(),
            [&](size_t x, size_t y) { return t[x].device.device_id < t[y].device.device_id; });
  for (size_t k = 1; k < n; ++k) {
    const size_t a = std::min((*order)[k - 1], (*order)[k]), c = std::max((*order)[k - 1], (*order)[k]);
    if (t[a].device.device_id == t[c].device.device_id) {
      return InvalidArgument(ArgName(side, c) + " is on device " + std::to_string(t[c].device.device_id) + " like " +
                             ArgName(side, a) + ": one buffer per device");
    }
  }
  // Virtual CPU devices share one address space, so distinct devices do not imply
  // distinct memory.
  std::vector<size_t> by_address(*order);
  std::sort(by_address.begin(), by_address.end(),
            [&](size_t x, size_t y) { return TensorBytes(t[x]) < TensorBytes(t[y]); });
  for (size_t k = 1; k<n&& * bytes> 0; ++k) {
    if (TensorBytes(t[by_address[k]]) < TensorBytes(t[by_address[k - 1]]) + *bytes) {
      return InvalidArgument(ArgName(side, std::max(by_address[k], by_address[k - 1])) + " overlaps " +
                             ArgName(side, std::min(by_address[k], by_address[k - 1])));
    }
  }
  return Status::Ok();
}

bool DirectlyReadable(Context& ctx, int reader, int owner) {
  return reader == owner || !ctx.backend().HasPeerAccess() || ctx.topology().PeerEnabled(owner, reader);
}

Status Readable(Context& ctx, int reader, int owner, const void* ptr, size_t bytes, Stream stream,
                BorrowedScratch* scratch, const void** out) {
  if (DirectlyReadable(ctx, reader, owner)) {
    *out = ptr;
    return Status::Ok();
  }
  void* staged = nullptr;
  QLINK_RETURN_IF_ERROR(scratch->Take(reader, bytes, stream, &staged));
  const CopyLeaf leaf{ptr, staged, bytes};
  *out = staged;
  return ctx.backend().CopyLeaves(reader, owner, &leaf, 1, stream);
}

}  // namespace qlink
