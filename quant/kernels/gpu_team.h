// Lanes exchanging values within teams of `width` lanes (a power of two up to 32, so a
// team never straddles a warp on CUDA or a wavefront on AMD), one source for CUDA and HIP.
// Every lane of the warp takes part.
#pragma once

#include "backends/gpu/gpu_device.h"

namespace qlink {
namespace quant {
namespace gpu {

template <typename T>
__device__ __forceinline__ T TeamShuffle(T v, int lane, int width) {
#if defined(QLINK_GPU_HIP)
  return __shfl(v, lane, width);
#else
  return __shfl_sync(0xffffffffu, v, lane, width);
#endif
}

template <typename T>
__device__ __forceinline__ T TeamXor(T v, int mask, int width) {
#if defined(QLINK_GPU_HIP)
  return __shfl_xor(v, mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
#endif
}

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
