// The pull-copy kernel's launcher (built by nvcc, called from the backend's host code).
#pragma once

#include <cstddef>
#include <vector>

#include "backends/gpu/gpu_runtime.h"

#include "backends/device_backend.h"

namespace qlink {
namespace gpu {

// One launch on the current device copying every leaf; leaves may live on the current
// device or on peers it has access to. Batches past one launch's parameter space are
// split into consecutive launches on the same stream.
gpuError_t LaunchPullLeaves(const CopyLeaf* leaves, size_t count, int sm_count, gpuStream_t stream);

// The same batch as a table of chunk descriptors in device memory, for prepared plans:
// DescribePullTable fills the host copy of the table and returns the grid; the table is
// copied to the device once, then launched as often as wanted. One launch whatever the count.
unsigned DescribePullTable(const CopyLeaf* leaves, size_t count, int sm_count, std::vector<char>* table);
gpuError_t LaunchPullTable(const void* device_table, size_t table_bytes, unsigned grid, gpuStream_t stream);

}  // namespace gpu
}  // namespace qlink
