// The part of the NCCL C API qlink calls, resolved at run time from libnccl.so.2 (or
// RCCL's librccl.so.1, which has the same C API): qlink builds and loads without it, and
// a host picks the library its framework already ships.
#pragma once

#include <cstddef>
#include <string>

#include "backends/status.h"

namespace qlink {

struct NcclApi {
  using Result = int;  // ncclResult_t; 0 is ncclSuccess
  using Comm = void*;  // ncclComm_t
  struct UniqueId {
    char internal[128];  // NCCL_UNIQUE_ID_BYTES
  };
  // ncclDataType_t and ncclRedOp_t values this file uses.
  static constexpr int kInt8 = 0, kFloat32 = 7;
  static constexpr int kSum = 0, kAvg = 4;

  Result (*GetUniqueId)(UniqueId*);
  Result (*CommInitRank)(Comm*, int nranks, UniqueId id, int rank);
  Result (*CommDestroy)(Comm);
  Result (*AllReduce)(const void* send, void* recv, size_t count, int dtype, int op, Comm, void* stream);
  Result (*Broadcast)(const void* send, void* recv, size_t count, int dtype, int root, Comm, void* stream);
  Result (*Reduce)(const void* send, void* recv, size_t count, int dtype, int op, int root, Comm, void* stream);
  Result (*ReduceScatter)(const void* send, void* recv, size_t recv_count, int dtype, int op, Comm, void* stream);
  Result (*AllGather)(const void* send, void* recv, size_t send_count, int dtype, Comm, void* stream);
  const char* (*GetErrorString)(Result);

  // Status of an NCCL call named `what`.
  Status Check(Result r, const char* what) const;
};

// Loads `library` (a file name searched like dlopen does, or a path) once per process;
// the API stays valid for the life of the process.
Status LoadNccl(const std::string& library, const NcclApi** out);

}  // namespace qlink
