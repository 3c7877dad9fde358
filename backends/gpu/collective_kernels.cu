// Collective kernels: a deterministic sum that reads every partial straight from peer
// memory, the bf16 cast for halved transport, and sign expansion for sign-cast.
#include "backends/gpu/collective_kernels.h"

#include "backends/gpu/gpu_device.h"

#include <algorithm>

namespace qlink {
namespace gpu {
namespace {

constexpr int kThreads = 512;

struct Inputs {
  const void* ptr[kMaxParticipants];
};

__device__ __forceinline__ float Load(const void* p, size_t i, bool bf16) {
  return bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ float4 Load4(const void* p, size_t v, bool bf16) {
  if (bf16) {
    const uint2 raw = static_cast<const uint2*>(p)[v];  // 4 bf16 values
    return make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                       __uint_as_float(raw.y & 0xffff0000u));
  }
  return static_cast<const float4*>(p)[v];
}

__device__ __forceinline__ int8_t Sign(float x) { return static_cast<int8_t>((x > 0.0f) - (x < 0.0f)); }

// Partials summed in the order given: every element's result is bit-identical whatever
// order the host handed them over in, and on every device that computes it. kFixed > 0
// unrolls the input loop so every partial's load is in flight at once (peer reads are
// latency bound); 0 takes the count from `n`.
template <int kFixed>
__global__ void __launch_bounds__(kThreads)
    ReduceKernel(const QLINK_GRID_CONSTANT Inputs in, int n, bool bf16, void* out, size_t count, float scale,
                 bool signs, bool vectorized) {
  const size_t stride = size_t(gridDim.x) * kThreads;
  size_t first_scalar = 0;
  if (vectorized) {
    const size_t vectors = count / 4;
    for (size_t v = blockIdx.x * size_t(kThreads) + threadIdx.x; v < vectors; v += stride) {
      float4 acc;
      if constexpr (kFixed > 0) {
        float4 x[kFixed];
#pragma unroll
        for (int k = 0; k < kFixed; ++k) x[k] = Load4(in.ptr[k], v, bf16);
        acc = x[0];
#pragma unroll
        for (int k = 1; k < kFixed; ++k) {
          acc.x += x[k].x;
          acc.y += x[k].y;
          acc.z += x[k].z;
          acc.w += x[k].w;
        }
      } else {
        acc = Load4(in.ptr[0], v, bf16);
        for (int k = 1; k < n; ++k) {
          const float4 x = Load4(in.ptr[k], v, bf16);
          acc.x += x.x;
          acc.y += x.y;
          acc.z += x.z;
          acc.w += x.w;
        }
      }
      acc.x *= scale;
      acc.y *= scale;
      acc.z *= scale;
      acc.w *= scale;
      if (signs) {
        static_cast<char4*>(out)[v] = make_char4(Sign(acc.x), Sign(acc.y), Sign(acc.z), Sign(acc.w));
      } else {
        static_cast<float4*>(out)[v] = acc;
      }
    }
    first_scalar = vectors * 4;
  }
  for (size_t i = first_scalar + blockIdx.x * size_t(kThreads) + threadIdx.x; i < count; i += stride) {
    float acc = Load(in.ptr[0], i, bf16);
    for (int k = 1; k < n; ++k) acc += Load(in.ptr[k], i, bf16);
    acc *= scale;
    if (signs) {
      static_cast<int8_t*>(out)[i] = Sign(acc);
    } else {
      static_cast<float*>(out)[i] = acc;
    }
  }
}

__global__ void CastKernel(uint16_t* out, const float* in, size_t count) {
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < count; i += size_t(gridDim.x) * kThreads) {
    out[i] = FloatToBf16(in[i]);
  }
}

__global__ void ExpandKernel(float* out, const int8_t* signs, size_t count) {
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < count; i += size_t(gridDim.x) * kThreads) {
    out[i] = static_cast<float>(signs[i]);
  }
}

template <int kWorld>
struct OneShotParams {
  int rank, world;
  const float* input;
  float* output;
  size_t count;
  void* staging[kWorld];
  unsigned long long* flags[kWorld];
  unsigned long long epoch;
  bool bf16, signs, vectorized;
  float scale;
};

constexpr long long kSpinTimeout = 20 * kClockTicksPerSecond;  // a missing peer ends the wait, not the process

__device__ __forceinline__ uint2 ToBf16x4(float4 x) {
  return make_uint2(FloatToBf16(x.x) | (uint32_t(FloatToBf16(x.y)) << 16),
                    FloatToBf16(x.z) | (uint32_t(FloatToBf16(x.w)) << 16));
}

// Block b of every rank owns slice b of the buffer: it stages that slice, raises flag
// (rank, b) on every rank, waits for flag (j, b) of every rank j, then sums slice b of
// every staged partial. Blocks never wait for each other, and a buffer of up to 256 KiB
// spreads so that each thread moves one 16-byte vector (a few, up to 1 MiB): the peer
// reads of the sum are in flight together instead of one latency after another.
template <int kWorld>
__global__ void __launch_bounds__(kThreads) OneShotKernel(const QLINK_GRID_CONSTANT OneShotParams<kWorld> p) {
  const size_t unit = p.vectorized ? 4 : 1;  // elements per step
  const size_t units = p.count / unit;
  const size_t per_block = (units + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(units, blockIdx.x * per_block), end = min(units, begin + per_block);
  void* slot = p.staging[p.rank];
  for (size_t u = begin + threadIdx.x; u < end; u += kThreads) {
    if (p.vectorized) {
      const float4 x = reinterpret_cast<const float4*>(p.input)[u];
      if (p.bf16) {
        static_cast<uint2*>(slot)[u] = ToBf16x4(x);
      } else {
        static_cast<float4*>(slot)[u] = x;
      }
    } else if (p.bf16) {
      static_cast<uint16_t*>(slot)[u] = FloatToBf16(p.input[u]);
    } else {
      static_cast<float*>(slot)[u] = p.input[u];
    }
  }
  __syncthreads();
  const int flag = p.rank * kOneShotMaxBlocks + blockIdx.x;
  if (threadIdx.x == 0) {
    __threadfence_system();  // the staged slice is visible before the flag
    for (int j = 0; j < p.world; ++j) atomicMax(p.flags[j] + flag, p.epoch);
  }
  if (threadIdx.x < p.world) {
    volatile unsigned long long* mine = p.flags[p.rank] + threadIdx.x * kOneShotMaxBlocks + blockIdx.x;
    const long long start = WallClock();
    while (*mine < p.epoch && WallClock() - start < kSpinTimeout) {
    }
  }
  __syncthreads();
  __threadfence_system();
  // Rank order: the same result on every rank.
  for (size_t u = begin + threadIdx.x; u < end; u += kThreads) {
    if (p.vectorized) {
      float4 x[kWorld];
#pragma unroll
      for (int j = 0; j < kWorld; ++j) {
        if (j < p.world) x[j] = Load4(p.staging[j], u, p.bf16);
      }
      float4 acc = x[0];
#pragma unroll
      for (int j = 1; j < kWorld; ++j) {
        if (j < p.world) {
          acc.x += x[j].x;
          acc.y += x[j].y;
          acc.z += x[j].z;
          acc.w += x[j].w;
        }
      }
      acc.x *= p.scale;
      acc.y *= p.scale;
      acc.z *= p.scale;
      acc.w *= p.scale;
      if (p.signs) acc = make_float4(Sign(acc.x), Sign(acc.y), Sign(acc.z), Sign(acc.w));
      reinterpret_cast<float4*>(p.output)[u] = acc;
    } else {
      float acc = Load(p.staging[0], u, p.bf16);
      for (int j = 1; j < p.world; ++j) acc += Load(p.staging[j], u, p.bf16);
      acc *= p.scale;
      p.output[u] = p.signs ? static_cast<float>(Sign(acc)) : acc;
    }
  }
}

template <int kWorld>
gpuError_t LaunchOneShotOf(const OneShotAllReduce& a, gpuStream_t stream) {
  OneShotParams<kWorld> p;
  p.rank = a.rank;
  p.world = a.world;
  p.input = a.input;
  p.output = a.output;
  p.count = a.count;
  for (int j = 0; j < kWorld; ++j) {
    p.staging[j] = j < a.world ? a.staging[j] : a.staging[0];
    p.flags[j] = reinterpret_cast<unsigned long long*>(j < a.world ? a.flags[j] : a.flags[0]);
  }
  p.epoch = a.epoch;
  p.bf16 = a.bf16;
  p.signs = a.signs;
  p.scale = a.scale;
  // Staging slots are 256-byte aligned; the host's buffers decide.
  p.vectorized = a.count % 4 == 0 && reinterpret_cast<uintptr_t>(a.input) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(a.output) % 16 == 0;
  const size_t units = p.vectorized ? a.count / 4 : a.count;
  const size_t blocks = std::min<size_t>(kOneShotMaxBlocks, std::max<size_t>(1, (units + kThreads - 1) / kThreads));
  OneShotKernel<kWorld><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return gpuGetLastError();
}

unsigned Grid(size_t work, int sm_count) {
  const size_t wanted = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(wanted, size_t(sm_count) * 4)));
}

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

gpuError_t LaunchReduceSum(void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                           float scale, bool signs, int sm_count, gpuStream_t stream) {
  if (num_inputs == 0 || num_inputs > kMaxParticipants) return gpuErrorInvalidValue;
  if (count == 0) return gpuSuccess;
  Inputs in;
  bool vectorized = Aligned(out, signs ? 4 : 16);
  for (size_t k = 0; k < num_inputs; ++k) {
    in.ptr[k] = inputs[k];
    vectorized = vectorized && Aligned(inputs[k], input_bf16 ? 8 : 16);
  }
  const unsigned grid = Grid(vectorized ? count / 4 : count, sm_count);
  const int n = static_cast<int>(num_inputs);
  switch (num_inputs) {
    case 2:
      ReduceKernel<2><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized);
      break;
    case 4:
      ReduceKernel<4><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized);
      break;
    case 8:
      ReduceKernel<8><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized);
      break;
    default:
      ReduceKernel<0><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized);
  }
  return gpuGetLastError();
}

gpuError_t LaunchCastToBf16(uint16_t* out, const float* in, size_t count, int sm_count, gpuStream_t stream) {
  if (count == 0) return gpuSuccess;
  CastKernel<<<Grid(count, sm_count), kThreads, 0, stream>>>(out, in, count);
  return gpuGetLastError();
}

gpuError_t LaunchExpandSigns(float* out, const int8_t* signs, size_t count, int sm_count, gpuStream_t stream) {
  if (count == 0) return gpuSuccess;
  ExpandKernel<<<Grid(count, sm_count), kThreads, 0, stream>>>(out, signs, count);
  return gpuGetLastError();
}

gpuError_t LaunchOneShot(const OneShotAllReduce& a, gpuStream_t stream) {
  if (a.world < 1 || a.world > static_cast<int>(kMaxParticipants)) return gpuErrorInvalidValue;
  // Parameter space grows with the world; the usual worlds take a small instantiation.
  if (a.world <= 2) return LaunchOneShotOf<2>(a, stream);
  if (a.world <= 8) return LaunchOneShotOf<8>(a, stream);
  return LaunchOneShotOf<kMaxParticipants>(a, stream);
}

}  // namespace gpu
}  // namespace qlink
