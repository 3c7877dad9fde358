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
  const void* ptr[kMaxReduceInputs];
};

__device__ __forceinline__ float Load(const void* p, size_t i, bool bf16) {
  return bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ float4 Load4(const void* p, size_t v, bool bf16) {
  if (bf16) {
    const uint2 raw = static_cast<const uint2*>(p)[v];  // 4 bf16 values
    return make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                       __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u));
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
          acc.x += x[k].x; acc.y += x[k].y; acc.z += x[k].z; acc.w += x[k].w;
        }
      } else {
        acc = Load4(in.ptr[0], v, bf16);
        for (int k = 1; k < n; ++k) {
          const float4 x = Load4(in.ptr[k], v, bf16);
          acc.x += x.x; acc.y += x.y; acc.z += x.z; acc.w += x.w;
        }
      }
      acc.x *= scale; acc.y *= scale; acc.z *= scale; acc.w *= scale;
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

struct OneShotParams {
  int rank, world;
  const float* input;
  float* output;
  size_t count;
  void* staging[kMaxReduceInputs];
  unsigned long long* flags[kMaxReduceInputs];
  unsigned long long epoch;
  bool bf16, signs;
  float scale;
};

constexpr long long kSpinTimeout = 20 * kClockTicksPerSecond;  // a missing peer ends the wait, not the process

// Block b of every rank owns slice b of the buffer: it stages that slice, raises flag
// (rank, b) on every rank, waits for flag (j, b) of every rank j, then sums slice b of
// every staged partial. Blocks never wait for each other, so many blocks share the
// latency of the peer reads.
__global__ void __launch_bounds__(kThreads) OneShotKernel(const QLINK_GRID_CONSTANT OneShotParams p) {
  const size_t per_block = (p.count + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(p.count, blockIdx.x * per_block), end = min(p.count, begin + per_block);
  if (p.bf16) {
    uint16_t* slot = static_cast<uint16_t*>(p.staging[p.rank]);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) slot[i] = FloatToBf16(p.input[i]);
  } else {
    float* slot = static_cast<float*>(p.staging[p.rank]);
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads) slot[i] = p.input[i];
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
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float acc = Load(p.staging[0], i, p.bf16);
    for (int j = 1; j < p.world; ++j) acc += Load(p.staging[j], i, p.bf16);
    acc *= p.scale;
    p.output[i] = p.signs ? static_cast<float>(Sign(acc)) : acc;
  }
}

unsigned Grid(size_t work, int sm_count) {
  const size_t wanted = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(wanted, size_t(sm_count) * 4)));
}

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

gpuError_t LaunchReduceSum(void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                            float scale, bool signs, int sm_count, gpuStream_t stream) {
  if (num_inputs == 0 || num_inputs > kMaxReduceInputs) return gpuErrorInvalidValue;
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
    case 2: ReduceKernel<2><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized); break;
    case 4: ReduceKernel<4><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized); break;
    case 8: ReduceKernel<8><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized); break;
    default: ReduceKernel<0><<<grid, kThreads, 0, stream>>>(in, n, input_bf16, out, count, scale, signs, vectorized);
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
  if (a.world < 1 || a.world > static_cast<int>(kMaxReduceInputs)) return gpuErrorInvalidValue;
  OneShotParams p;
  p.rank = a.rank;
  p.world = a.world;
  p.input = a.input;
  p.output = a.output;
  p.count = a.count;
  for (int j = 0; j < a.world; ++j) {
    p.staging[j] = a.staging[j];
    p.flags[j] = reinterpret_cast<unsigned long long*>(a.flags[j]);
  }
  p.epoch = a.epoch;
  p.bf16 = a.bf16;
  p.signs = a.signs;
  p.scale = a.scale;
  // About 16 elements per thread: enough blocks that peer-read latency overlaps.
  const size_t blocks = std::min<size_t>(kOneShotMaxBlocks, std::max<size_t>(1, a.count / (kThreads * 16)));
  OneShotKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return gpuGetLastError();
}

}  // namespace gpu
}  // namespace qlink
