// What the GPU kernels need beyond the runtime names, per vendor: the device headers, the
// parameter-space qualifier, a wall clock for timeouts, and bf16 as bits (so CPU, CUDA
// and HIP round the same way).
#pragma once

#include <cstdint>

#if defined(QLINK_GPU_HIP)
#include <hip/hip_runtime.h>
#define QLINK_GRID_CONSTANT
#else
#include <cuda_runtime.h>
#define QLINK_GRID_CONSTANT __grid_constant__
#endif

#include "backends/gpu/gpu_runtime.h"

namespace qlink {
namespace gpu {

#if defined(QLINK_GPU_HIP)
constexpr long long kClockTicksPerSecond = 100000000;  // s_memrealtime runs at 100 MHz
// Kernel parameters are limited to 4 KiB on HIP: pull batches are split into launches
// of this many leaves.
constexpr size_t kMaxLeavesPerLaunch = 64;
#else
constexpr long long kClockTicksPerSecond = 1000000000;  // %globaltimer counts nanoseconds
constexpr size_t kMaxLeavesPerLaunch = 1000;            // 32 + 1000 * 32 bytes < 32764
#endif

__device__ __forceinline__ long long WallClock() {
#if defined(QLINK_GPU_HIP)
#if defined(__HIP_DEVICE_COMPILE__)
  return wall_clock64();
#else
  return 0;
#endif
#else
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

__device__ __forceinline__ float Bf16ToFloat(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays a quiet NaN (as cpu_kernels.cc).
__device__ __forceinline__ uint16_t FloatToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace gpu
}  // namespace qlink
