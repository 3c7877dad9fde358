// Launchers of the GPTQ engine's kernels, one source for CUDA and HIP (built by nvcc or
// hipcc into the GPU backend, called by quant/gpu). Each enqueues on `stream` of the
// current device and returns the launch's error.
#pragma once

#include <cstdint>

#include "backends/gpu/gpu_runtime.h"
#include "quant/quant_math.h"

namespace qlink {
namespace quant {
namespace gpu {

gpuError_t LaunchDiagonal(const float* h, int64_t n, float* out, gpuStream_t stream);
gpuError_t LaunchPrepareHessian(const float* h, int64_t n, const int32_t* perm, float diag_add, float* out,
                                gpuStream_t stream);
gpuError_t LaunchIdentity(float* a, int64_t n, gpuStream_t stream);
gpuError_t LaunchMirrorTriangle(float* a, int64_t n, bool lower_to_upper, gpuStream_t stream);
gpuError_t LaunchReverse(const float* in, float* out, int64_t count, gpuStream_t stream);
gpuError_t LaunchLoadWeight(const void* w, DLDataType dtype, int64_t rows, int64_t cols, const int32_t* perm,
                            float* out, gpuStream_t stream);
gpuError_t LaunchStoreWeight(const float* w, int64_t rows, int64_t cols, const int32_t* position, DLDataType dtype,
                             void* out, gpuStream_t stream);
gpuError_t LaunchStoreCodes(const uint8_t* codes, int64_t rows, int64_t cols, const int32_t* position, uint8_t* out,
                            gpuStream_t stream);
gpuError_t LaunchZeroColumns(float* w, int64_t rows, int64_t ld, const int32_t* columns, int64_t count,
                             gpuStream_t stream);
gpuError_t LaunchGroupRanges(const float* w, int64_t rows, int64_t ld, int64_t group_size, int64_t first_group,
                             int64_t num_groups, const int32_t* columns, Grid grid, float* scales, float* zeros,
                             int64_t groups, gpuStream_t stream);
gpuError_t LaunchQuantizeBlock(const BlockArgs& args, gpuStream_t stream);
gpuError_t LaunchToFloat(const void* x, DLDataType dtype, int64_t count, float* out, gpuStream_t stream);

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
