#include "core/nccl_api.h"

#include "backends/vendor_library.h"

namespace qlink {

Status NcclApi::Check(Result r, const char* what) const {
  if (r == 0) return Status::Ok();
  return RuntimeError(std::string("nccl: ") + what + " failed: " + GetErrorString(r) + " (" + std::to_string(r) + ")");
}

Status LoadNccl(const std::string& library, const NcclApi** out) {
  return LoadVendorLibraries(
      {{library, "NCCL", "nccl_library"}}, NcclApi{},
      [](VendorSymbols& take, NcclApi* a) {
        take(0, a->GetUniqueId, "ncclGetUniqueId");
        take(0, a->CommInitRank, "ncclCommInitRank");
        take(0, a->CommDestroy, "ncclCommDestroy");
        take(0, a->AllReduce, "ncclAllReduce");
        take(0, a->Broadcast, "ncclBroadcast");
        take(0, a->Reduce, "ncclReduce");
        take(0, a->ReduceScatter, "ncclReduceScatter");
        take(0, a->AllGather, "ncclAllGather");
        take(0, a->GetErrorString, "ncclGetErrorString");
      },
      out);
}

}  // namespace qlink
