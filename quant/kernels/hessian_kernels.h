// The Hessian's rank-k update of 16-bit activations on NVIDIA tensor cores with IEEE fp32
// sums (CUDA only: built into the CUDA backend alone, called by quant/gpu where
// QLINK_GPU_HIP is not defined; HIP keeps hipBLAS's GemmEx).
#pragma once

#include <cstdint>

#include "backends/gpu/gpu_runtime.h"
#include "quant/quant_math.h"

namespace qlink {
namespace quant {
namespace gpu {

// Whether LaunchPromotedSyrk takes x (rows x n, bf16 or fp16, row-major): its loads are
// 16-byte copies of 8 columns, so n must be a multiple of 8 and x 16-byte aligned.
inline bool PromotedSyrkFits(const void* x, int64_t n) {
  return n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// The lower triangle of h (n x n fp32, column-major) += x^T x, at 128 x 128 tile
// granularity (the diagonal tiles are written whole; the caller mirrors). The tensor
// cores' sums of 32 rows are added into fp32 registers with IEEE adds, so their truncating
// accumulation never spans more than 32 exact products.
gpuError_t LaunchPromotedSyrk(const void* x, DLDataType dtype, int64_t rows, int64_t n, float* h, gpuStream_t stream);

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
