#include "quant/kernels/signround_kernels.h"

#include <algorithm>

#include "backends/gpu/gpu_device.h"
#include "quant/kernels/gpu_team.h"
#include "quant/kernels/signround_math.h"

namespace qlink {
namespace quant {
namespace gpu {
namespace {

// A warp (32 lanes, kSignRoundLanes) per group, 8 groups a block; lane l owns the group's
// chunks l, l + 32, ... of kSignRoundChunk elements, each one vector load where the
// layer's pointers and group length allow it.
constexpr int kThreads = 256;
constexpr int kGroupsPerBlock = kThreads / kSignRoundLanes;
constexpr int kChunk = kSignRoundChunk;

template <Fmt F>
struct Element;
template <>
struct Element<Fmt::kF32> {
  __device__ static float Get(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  __device__ static void Put(void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; }
  __device__ static void Get4(const void* p, int64_t i, float* out) {
    const float4 q = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    out[0] = q.x, out[1] = q.y, out[2] = q.z, out[3] = q.w;
  }
  __device__ static void Put4(void* p, int64_t i, const float* v) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(v[0], v[1], v[2], v[3]);
  }
};
template <Fmt F>
struct Element16 {
  __device__ static float ToFloat(uint16_t b) { return F == Fmt::kBf16 ? Bf16ToFloat(b) : HalfToFloat(b); }
  __device__ static uint16_t FromFloat(float v) { return F == Fmt::kBf16 ? FloatToBf16(v) : FloatToHalf(v); }
  __device__ static float Get(const void* p, int64_t i) { return ToFloat(static_cast<const uint16_t*>(p)[i]); }
  __device__ static void Put(void* p, int64_t i, float v) { static_cast<uint16_t*>(p)[i] = FromFloat(v); }
  __device__ static void Get4(const void* p, int64_t i, float* out) {
    const uint2 q = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
    out[0] = ToFloat(q.x & 0xffffu), out[1] = ToFloat(q.x >> 16), out[2] = ToFloat(q.y & 0xffffu),
    out[3] = ToFloat(q.y >> 16);
  }
  __device__ static void Put4(void* p, int64_t i, const float* v) {
    uint2 q;
    q.x = FromFloat(v[0]) | (static_cast<uint32_t>(FromFloat(v[1])) << 16);
    q.y = FromFloat(v[2]) | (static_cast<uint32_t>(FromFloat(v[3])) << 16);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) = q;
  }
};
template <>
struct Element<Fmt::kBf16> : Element16<Fmt::kBf16> {};
template <>
struct Element<Fmt::kF16> : Element16<Fmt::kF16> {};

__device__ __forceinline__ int ChunkLength(const SignRoundLayer& l, int64_t j) {
  return l.group_len - j < kChunk ? static_cast<int>(l.group_len - j) : kChunk;
}

// Chunk `at` (its first element's index in the layer) of n <= kChunk elements.
template <Fmt F>
__device__ __forceinline__ void LoadChunk(const void* p, int64_t at, int n, bool vec, float* out) {
  if (vec) {
    Element<F>::Get4(p, at, out);
  } else {
    for (int i = 0; i < n; ++i) out[i] = Element<F>::Get(p, at + i);
  }
}

template <Fmt F>
__device__ __forceinline__ void StoreChunk(void* p, int64_t at, int n, bool vec, const float* v) {
  if (vec) {
    Element<F>::Put4(p, at, v);
  } else {
    for (int i = 0; i < n; ++i) Element<F>::Put(p, at + i, v[i]);
  }
}

// The group's parameters, every lane of the warp holding them; lane 0 writes the clamped
// range factors back when asked.
template <Fmt W>
__device__ SignRoundGroup GroupOf(const SignRoundConfig& c, const SignRoundLayer& l, int64_t g, int lane, bool vec,
                                  bool write_back) {
  const int64_t base = g * l.group_len;
  float lo = 0.0f, hi = 0.0f;
  for (int64_t j = int64_t(lane) * kChunk; j < l.group_len; j += kSignRoundLanes * kChunk) {
    const int n = ChunkLength(l, j);
    float w[kChunk];
    LoadChunk<W>(l.weight, base + j, n, vec, w);
    for (int i = 0; i < n; ++i) lo = fminf(lo, w[i]), hi = fmaxf(hi, w[i]);
  }
  for (int mask = kSignRoundLanes / 2; mask > 0; mask /= 2) {
    lo = fminf(lo, TeamXor(lo, mask, kSignRoundLanes));
    hi = fmaxf(hi, TeamXor(hi, mask, kSignRoundLanes));
  }
  const float min_scale = Clamp(l.min_scale[g], 0.0f, 1.0f), max_scale = Clamp(l.max_scale[g], 0.0f, 1.0f);
  if (write_back && lane == 0) {
    l.min_scale[g] = min_scale;
    l.max_scale[g] = max_scale;
  }
  return SignRoundParams(c, lo, hi, min_scale, max_scale);
}

template <Fmt W>
__global__ void __launch_bounds__(kThreads) ForwardKernel(SignRoundConfig c, SignRoundLayer l, bool vec) {
  const int lane = threadIdx.x % kSignRoundLanes;
  const int64_t g = int64_t(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kSignRoundLanes;
  if (g >= l.groups()) return;  // the whole warp: a group is one warp's
  const SignRoundGroup p = GroupOf<W>(c, l, g, lane, vec, true);
  const int64_t base = g * l.group_len;
  for (int64_t j = int64_t(lane) * kChunk; j < l.group_len; j += kSignRoundLanes * kChunk) {
    const int n = ChunkLength(l, j);
    float w[kChunk], v[kChunk], out[kChunk];
    LoadChunk<W>(l.weight, base + j, n, vec, w);
    LoadChunk<Fmt::kF32>(l.v, base + j, n, vec, v);
    for (int i = 0; i < n; ++i) out[i] = SignRoundQdq(c, p, w[i], v[i]);
    StoreChunk<W>(l.qdq, base + j, n, vec, out);
  }
}

__device__ __forceinline__ double WarpSum(double x) {
  for (int mask = kSignRoundLanes / 2; mask > 0; mask /= 2) x += TeamXor(x, mask, kSignRoundLanes);
  return x;
}

template <Fmt W>
__global__ void __launch_bounds__(kThreads) BackwardKernel(SignRoundConfig c, SignRoundLayer l, bool vec) {
  const int lane = threadIdx.x % kSignRoundLanes;
  const int64_t g = int64_t(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kSignRoundLanes;
  if (g >= l.groups()) return;
  const SignRoundGroup p = GroupOf<W>(c, l, g, lane, vec, false);
  const int64_t base = g * l.group_len;
  SignRoundTerms t;
  for (int64_t j = int64_t(lane) * kChunk; j < l.group_len; j += kSignRoundLanes * kChunk) {
    const int n = ChunkLength(l, j);
    float w[kChunk], v[kChunk], grad[kChunk], grad_v[kChunk];
    LoadChunk<W>(l.weight, base + j, n, vec, w);
    LoadChunk<Fmt::kF32>(l.v, base + j, n, vec, v);
    LoadChunk<W>(l.grad_qdq, base + j, n, vec, grad);
    for (int i = 0; i < n; ++i) grad_v[i] = SignRoundElementGrad(c, p, w[i], v[i], grad[i], &t);
    StoreChunk<Fmt::kF32>(l.grad_v, base + j, n, vec, grad_v);
  }
  // The lanes combined by halves: lane l < half adds lane l + half, as the CPU's Combine.
  const SignRoundTerms total{WarpSum(t.scale_product), WarpSum(t.scale_quotient), WarpSum(t.zero_product),
                             WarpSum(t.zero_level)};
  if (lane != 0) return;
  float grad_min, grad_max;
  SignRoundGroupGrad(c, p, RoundSums(c, total), &grad_min, &grad_max);
  if (l.grad_min_scale != nullptr) l.grad_min_scale[g] = grad_min;
  if (l.grad_max_scale != nullptr) l.grad_max_scale[g] = grad_max;
}

__global__ void SignSgdKernel(float* param, const float* grad, float* best, int64_t count, const float* lr,
                              const float* loss, const float* best_loss) {
  const bool keep = best != nullptr && loss != nullptr && *loss < *best_loss;
  const float rate = *lr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = param[i];
    if (keep) best[i] = p;
    param[i] = SignSgdUpdate(p, grad[i], rate);
  }
}

__global__ void ScheduleKernel(SignSgdStep s) {
  if (s.loss != nullptr && *s.loss < *s.best_loss) *s.best_loss = *s.loss;
  if (s.epoch == nullptr) return;
  const int64_t epoch = ++*s.epoch;
  for (size_t k = 0; k < s.num_lrs; ++k) s.lrs[k] = LinearLrNext(s.lrs[k], epoch, s.total_iters);
}

bool Aligned(const void* p, int bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether every chunk can be one vector load: whole chunks, aligned pointers.
bool Vectorizable(const SignRoundLayer& l, Fmt w) {
  const int wbytes = w == Fmt::kF32 ? 16 : 8;
  return l.group_len % kChunk == 0 && Aligned(l.weight, wbytes) && Aligned(l.qdq, wbytes) &&
         Aligned(l.grad_qdq, wbytes) && Aligned(l.v, 16) && Aligned(l.grad_v, 16);
}

unsigned Blocks(int64_t groups) { return static_cast<unsigned>((groups + kGroupsPerBlock - 1) / kGroupsPerBlock); }

}  // namespace

gpuError_t LaunchSignRoundForward(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  const bool vec = Vectorizable(l, c.weight);
  switch (c.weight) {
    case Fmt::kF32:
      ForwardKernel<Fmt::kF32><<<Blocks(l.groups()), kThreads, 0, stream>>>(c, l, vec);
      break;
    case Fmt::kBf16:
      ForwardKernel<Fmt::kBf16><<<Blocks(l.groups()), kThreads, 0, stream>>>(c, l, vec);
      break;
    case Fmt::kF16:
      ForwardKernel<Fmt::kF16><<<Blocks(l.groups()), kThreads, 0, stream>>>(c, l, vec);
      break;
  }
  return gpuGetLastError();
}

gpuError_t LaunchSignRoundBackward(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  const bool vec = Vectorizable(l, c.weight);
  switch (c.weight) {
    case Fmt::kF32:
      BackwardKernel<Fmt::kF32><<<Blocks(l.groups()), kThreads, 0, stream>>>(c, l, vec);
      break;
    case Fmt::kBf16:
      BackwardKernel<Fmt::kBf16><<<Blocks(l.groups()), kThreads, 0, stream>>>(c, l, vec);
      break;
    case Fmt::kF16:
      BackwardKernel<Fmt::kF16><<<Blocks(l.groups()), kThreads, 0, stream>>>(c, l, vec);
      break;
  }
  return gpuGetLastError();
}

gpuError_t LaunchSignSgdTensor(const SignSgdStep& s, const SignSgdTensor& t, gpuStream_t stream) {
  if (t.count == 0) return gpuSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((t.count + kThreads - 1) / kThreads, 4096));
  SignSgdKernel<<<blocks, kThreads, 0, stream>>>(t.param, t.grad, t.best, t.count, s.lrs + t.lr_group, s.loss,
                                                 s.best_loss);
  return gpuGetLastError();
}

gpuError_t LaunchSignSgdSchedule(const SignSgdStep& s, gpuStream_t stream) {
  ScheduleKernel<<<1, 1, 0, stream>>>(s);
  return gpuGetLastError();
}

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
