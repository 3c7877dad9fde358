#include "quant/kernels/signround_kernels.h"

#include <algorithm>
#include <memory>

#include "backends/gpu/gpu_device.h"
#include "quant/kernels/gpu_team.h"
#include "quant/kernels/signround_math.h"

namespace qlink {
namespace quant {
namespace gpu {
namespace {

// Two kernels per pass. The team kernels take groups of 32 to 512 elements (a power of
// two) with vector-aligned buffers: a team of group_len / 16 threads per group, each
// thread holding four chunks of kSignRoundChunk elements (its weight, v and upstream
// gradient) in registers from one round of loads issued before any reduction. So every
// byte is read once, a thread has 96 bytes in flight in a bf16 forward and 128 in the
// backward, and the per-group work (range, parameters, sums) spreads over 16 elements a
// thread. The generic kernels take any group: a warp (32 lanes, kSignRoundLanes) per
// group, 8 groups a block, lane l owning the group's chunks l, l + 32, ..., each one
// vector load where the layer's pointers and group length allow it; they read the weight
// twice (its range first) instead of holding a whole row in registers.
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
__device__ void ForwardGroups(const SignRoundConfig& c, const SignRoundLayer& l, bool vec) {
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

// A backward's step of v (SignRoundLayer::step_v): whether v is kept as best first, and
// the update of a chunk in place, as the step kernel's SignSgdUpdate.
struct VStepOf {
  bool keep = false;
  float lr = 0.0f;
  __device__ explicit VStepOf(const SignRoundLayer& l) {
    if (l.step_v == nullptr) return;
    keep = l.best_v != nullptr && LossImproved(l.loss, l.best_loss);
    lr = *l.step_lr;
  }
  __device__ void Apply(float* v, const float* grad, int n) const {
    for (int i = 0; i < n; ++i) v[i] = SignSgdUpdate(v[i], grad[i], lr);
  }
};

template <Fmt W>
__device__ void BackwardGroups(const SignRoundConfig& c, const SignRoundLayer& l, bool vec) {
  const int lane = threadIdx.x % kSignRoundLanes;
  const int64_t g = int64_t(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kSignRoundLanes;
  if (g >= l.groups()) return;
  const SignRoundGroup p = GroupOf<W>(c, l, g, lane, vec, false);
  const int64_t base = g * l.group_len;
  const VStepOf step(l);
  SignRoundTerms t;
  for (int64_t j = int64_t(lane) * kChunk; j < l.group_len; j += kSignRoundLanes * kChunk) {
    const int n = ChunkLength(l, j);
    float w[kChunk], v[kChunk], grad[kChunk], grad_v[kChunk];
    LoadChunk<W>(l.weight, base + j, n, vec, w);
    LoadChunk<Fmt::kF32>(l.v, base + j, n, vec, v);
    LoadChunk<W>(l.grad_qdq, base + j, n, vec, grad);
    for (int i = 0; i < n; ++i) grad_v[i] = SignRoundElementGrad(c, p, w[i], v[i], grad[i], &t);
    if (l.step_v == nullptr) {
      StoreChunk<Fmt::kF32>(l.grad_v, base + j, n, vec, grad_v);
    } else {
      if (step.keep) StoreChunk<Fmt::kF32>(l.best_v, base + j, n, vec, v);
      step.Apply(v, grad_v, n);
      StoreChunk<Fmt::kF32>(l.step_v, base + j, n, vec, v);
    }
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

// The team kernels. Thread t of a team of kTeam holds the group's chunks t, t + kTeam, ...,
// one coalesced vector load each across the team. The documented order of the backward's
// sums has 32 lanes, chunk c on lane c % 32, so a thread stands for the kSignRoundLanes /
// kTeam lanes t, t + kTeam, ... (its "virtual lanes", chunk i of its own on virtual lane
// i % kVirtual), and the halving combine runs on this thread while a lane's partner
// (l + half) is its own, then across the team by shuffles. A team of fewer than 8 leaves
// virtual lanes without a chunk: they keep their start value, held as a constant.
constexpr int kHeld = 4;  // chunks a thread holds

template <int kTeam>
struct TeamSlot {
  static constexpr int kLen = kHeld * kTeam * kChunk;  // the group's length
  static constexpr int kVirtual = kSignRoundLanes / kTeam;
  static constexpr int kFilled = kVirtual < kHeld ? kVirtual : kHeld;  // virtual lanes with chunks
  int t;
  int64_t g;  // the team's group, the last one for a team past the end (computed, not stored)
  bool live;
  __device__ explicit TeamSlot(int64_t groups) {
    t = threadIdx.x % kTeam;
    const int64_t at = int64_t(blockIdx.x) * (kThreads / kTeam) + threadIdx.x / kTeam;
    live = at < groups;
    g = live ? at : groups - 1;  // every lane of the warp takes part in the shuffles
  }
  __device__ int64_t At(int i) const { return g * kLen + int64_t(t + i * kTeam) * kChunk; }
};

__device__ __forceinline__ float LaneXor(float x, int mask, int width) { return TeamXor(x, mask, width); }
__device__ __forceinline__ SignRoundTerms LaneXor(const SignRoundTerms& x, int mask, int width) {
  return {TeamXor(x.scale_product, mask, width), TeamXor(x.scale_quotient, mask, width),
          TeamXor(x.zero_product, mask, width), TeamXor(x.zero_level, mask, width)};
}

// The filled virtual lanes' values x (the others T{}) combined by halves (lane l < half
// takes op(lane l, lane l + half)): on thread 0 of the team, lane 0's value exactly as a
// warp of 32 lanes gets it. op(T{}, T{}) is T{}, so an empty lane stays one.
template <int kTeam, typename T, typename Op>
__device__ __forceinline__ T CombineLanes(T* x, Op op) {
  constexpr int kFilled = TeamSlot<kTeam>::kFilled;
#pragma unroll
  for (int half = kSignRoundLanes / 2; half >= kTeam; half /= 2) {
    const int h = half / kTeam;
#pragma unroll
    for (int k = 0; k < h && k < kFilled; ++k) x[k] = op(x[k], k + h < kFilled ? x[k + h] : T{});
  }
  T y = x[0];
#pragma unroll
  for (int half = kTeam / 2; half > 0; half /= 2) y = op(y, LaneXor(y, half, kTeam));
  return y;
}

template <int kTeam>
__device__ __forceinline__ SignRoundGroup TeamGroupOf(const SignRoundConfig& c, const float (&w)[kHeld][kChunk],
                                                      float min_scale, float max_scale) {
  constexpr int kVirtual = TeamSlot<kTeam>::kVirtual;
  float lo[TeamSlot<kTeam>::kFilled], hi[TeamSlot<kTeam>::kFilled];
#pragma unroll
  for (int k = 0; k < TeamSlot<kTeam>::kFilled; ++k) lo[k] = 0.0f, hi[k] = 0.0f;
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      lo[i % kVirtual] = fminf(lo[i % kVirtual], w[i][e]);
      hi[i % kVirtual] = fmaxf(hi[i % kVirtual], w[i][e]);
    }
  }
  const float wmin = CombineLanes<kTeam>(lo, [](float a, float b) { return fminf(a, b); });
  const float wmax = CombineLanes<kTeam>(hi, [](float a, float b) { return fmaxf(a, b); });
  return SignRoundParams(c, wmin, wmax, Clamp(min_scale, 0.0f, 1.0f), Clamp(max_scale, 0.0f, 1.0f));
}

// Blocks an SM keeps resident (CUDA's meaning; HIP reads it as waves per execution unit, a
// looser bound): at most 80 registers in the backward, 64 in the forward, so with a bf16
// weight an SM has 96 KB of loads in flight either way.
template <bool kBackward>
constexpr int kTeamBlocksPerSm = kBackward ? 3 : 4;

template <Fmt W, int kTeam, bool kBackward, bool kSym>
__device__ __forceinline__ void TeamGroups(const SignRoundConfig& config, const SignRoundLayer& l) {
  // Known here: the roundings to the weight's format inline without a branch, and a
  // symmetric range holds no registers for the zero point's sums.
  SignRoundConfig c = config;
  c.weight = W;
  c.sym = kSym;
  const TeamSlot<kTeam> s(l.groups());
  float w[kHeld][kChunk], v[kHeld][kChunk], grad[kHeld][kChunk];
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
    Element<W>::Get4(l.weight, s.At(i), w[i]);
    Element<Fmt::kF32>::Get4(l.v, s.At(i), v[i]);
    if (kBackward) Element<W>::Get4(l.grad_qdq, s.At(i), grad[i]);
  }
  const float min_scale = l.min_scale[s.g], max_scale = l.max_scale[s.g];
  const SignRoundGroup p = TeamGroupOf<kTeam>(c, w, min_scale, max_scale);
  float out[kHeld][kChunk];
  if (kBackward) {
    SignRoundTerms lanes[TeamSlot<kTeam>::kFilled];
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        out[i][e] = SignRoundElementGrad(c, p, w[i][e], v[i][e], grad[i][e], &lanes[i % TeamSlot<kTeam>::kVirtual]);
      }
    }
    const SignRoundTerms total = CombineLanes<kTeam>(lanes, [](const SignRoundTerms& a, const SignRoundTerms& b) {
      return SignRoundTerms{a.scale_product + b.scale_product, a.scale_quotient + b.scale_quotient,
                            a.zero_product + b.zero_product, a.zero_level + b.zero_level};
    });
    if (!s.live) return;
    if (l.step_v == nullptr) {
#pragma unroll
      for (int i = 0; i < kHeld; ++i) Element<Fmt::kF32>::Put4(l.grad_v, s.At(i), out[i]);
    } else {
      const VStepOf step(l);
#pragma unroll
      for (int i = 0; i < kHeld; ++i) {
        if (step.keep) Element<Fmt::kF32>::Put4(l.best_v, s.At(i), v[i]);
        step.Apply(v[i], out[i], kChunk);
        Element<Fmt::kF32>::Put4(l.step_v, s.At(i), v[i]);
      }
    }
    if (s.t != 0) return;
    float grad_min, grad_max;
    SignRoundGroupGrad(c, p, RoundSums(c, total), &grad_min, &grad_max);
    if (l.grad_min_scale != nullptr) l.grad_min_scale[s.g] = grad_min;
    if (l.grad_max_scale != nullptr) l.grad_max_scale[s.g] = grad_max;
  } else {
    if (!s.live) return;
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        out[i][e] = SignRoundDequant(c, p, SignRoundLevel(c, p, SignRoundQuotient(c, p, w[i][e]), v[i][e]));
      }
      Element<W>::Put4(l.qdq, s.At(i), out[i]);  // rounds to the weight's format
    }
    if (s.t != 0) return;
    l.min_scale[s.g] = p.min_scale;
    l.max_scale[s.g] = p.max_scale;
  }
}

// One layer's pass: the generic kernels' groups (a warp each) or a team kernel's.
template <Fmt W>
__global__ void __launch_bounds__(kThreads) ForwardKernel(SignRoundConfig c, SignRoundLayer l, bool vec) {
  ForwardGroups<W>(c, l, vec);
}

template <Fmt W>
__global__ void __launch_bounds__(kThreads) BackwardKernel(SignRoundConfig c, SignRoundLayer l, bool vec) {
  BackwardGroups<W>(c, l, vec);
}

template <Fmt W, int kTeam, bool kBackward, bool kSym>
__global__ void __launch_bounds__(kThreads, kTeamBlocksPerSm<kBackward>)
    TeamKernel(SignRoundConfig config, SignRoundLayer l) {
  TeamGroups<W, kTeam, kBackward, kSym>(config, l);
}

// A block's experts in one launch: expert blockIdx.y of the table, in its kernel parameters
// (up to kCapacity; 32 KiB of them on CUDA, 4 KiB on HIP), the groups along x as for one
// layer. Experts without tokens return at once, but for a backward's best_v: the block
// copies v there for the groups it would have taken (groups_per_block each).
template <int kCapacity>
struct ExpertTable {
  SignRoundLayer layers[kCapacity];
  ExpertTokens tokens;
  uint32_t first = 0;  // the table's first expert in the call (its tokens index)
};

template <int kCapacity>
__device__ __forceinline__ bool ExpertHasTokens(const ExpertTable<kCapacity>& t, int64_t groups_per_block,
                                                bool backward) {
  if (t.tokens.Has(t.first + blockIdx.y)) return true;
  const SignRoundLayer& l = t.layers[blockIdx.y];
  if (backward && l.step_v != nullptr && l.best_v != nullptr && LossImproved(l.loss, l.best_loss)) {
    const int64_t lo = int64_t(blockIdx.x) * groups_per_block;
    const int64_t hi = lo + groups_per_block < l.groups() ? lo + groups_per_block : l.groups();
    for (int64_t i = lo * l.group_len + threadIdx.x; i < hi * l.group_len; i += blockDim.x) l.best_v[i] = l.v[i];
  }
  return false;
}

template <Fmt W, bool kBackward, int kCapacity>
__global__ void __launch_bounds__(kThreads)
    ExpertsKernel(SignRoundConfig c, const QLINK_GRID_CONSTANT ExpertTable<kCapacity> t, bool vec) {
  if (!ExpertHasTokens(t, kGroupsPerBlock, kBackward)) return;
  if (kBackward) {
    BackwardGroups<W>(c, t.layers[blockIdx.y], vec);
  } else {
    ForwardGroups<W>(c, t.layers[blockIdx.y], vec);
  }
}

template <Fmt W, int kTeam, bool kBackward, bool kSym, int kCapacity>
__global__ void __launch_bounds__(kThreads, kTeamBlocksPerSm<kBackward>)
    ExpertsTeamKernel(SignRoundConfig c, const QLINK_GRID_CONSTANT ExpertTable<kCapacity> t) {
  if (!ExpertHasTokens(t, kThreads / kTeam, kBackward)) return;
  TeamGroups<W, kTeam, kBackward, kSym>(c, t.layers[blockIdx.y]);
}

__global__ void SignSgdKernel(float* param, const float* grad, float* best, int64_t count, const float* lr,
                              const float* loss, const float* best_loss) {
  const bool keep = best != nullptr && LossImproved(loss, best_loss);
  const float rate = *lr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = param[i];
    if (keep) best[i] = p;
    param[i] = SignSgdUpdate(p, grad[i], rate);
  }
}

// SignSGD over a block's experts' tensors in one launch: tensor blockIdx.y of the table
// (expert-major, per_expert tensors an expert), grid-strided along x; a tensor of an expert
// without tokens is only kept as best.
template <int kCapacity>
struct StepTable {
  SignSgdTensor tensors[kCapacity];
  ExpertTokens tokens;
  uint32_t first = 0;  // the table's first tensor in the call
  uint32_t per_expert = 1;
};

template <int kCapacity>
__global__ void SignSgdExpertsKernel(const QLINK_GRID_CONSTANT StepTable<kCapacity> t, const float* lrs,
                                     const float* loss, const float* best_loss) {
  const SignSgdTensor& x = t.tensors[blockIdx.y];
  const bool keep = x.best != nullptr && LossImproved(loss, best_loss);
  const bool update = t.tokens.Has((t.first + blockIdx.y) / t.per_expert);
  const float rate = lrs[x.lr_group];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < x.count; i += int64_t(gridDim.x) * blockDim.x) {
    const float p = x.param[i];
    if (keep) x.best[i] = p;
    if (update) x.param[i] = SignSgdUpdate(p, x.grad[i], rate);
  }
}

__global__ void ScheduleKernel(SignSgdStep s) {
  if (LossImproved(s.loss, s.best_loss)) *s.best_loss = *s.loss;
  if (s.epoch == nullptr) return;
  const int64_t epoch = ++*s.epoch;
  for (size_t k = 0; k < s.num_lrs; ++k) s.lrs[k] = LinearLrNext(s.lrs[k], epoch, s.total_iters);
}

bool Aligned(const void* p, int bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether every chunk can be one vector load: whole chunks, aligned pointers.
bool Vectorizable(const SignRoundLayer& l, Fmt w) {
  const int wbytes = w == Fmt::kF32 ? 16 : 8;
  return l.group_len % kChunk == 0 && Aligned(l.weight, wbytes) && Aligned(l.qdq, wbytes) &&
         Aligned(l.grad_qdq, wbytes) && Aligned(l.v, 16) && Aligned(l.grad_v, 16) && Aligned(l.best_v, 16);
}

unsigned Blocks(int64_t groups, int per_block) { return static_cast<unsigned>((groups + per_block - 1) / per_block); }

template <Fmt W, int kTeam, bool kBackward>
void LaunchTeam(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  const unsigned blocks = Blocks(l.groups(), kThreads / kTeam);
  if (c.sym) {
    TeamKernel<W, kTeam, kBackward, true><<<blocks, kThreads, 0, stream>>>(c, l);
  } else {
    TeamKernel<W, kTeam, kBackward, false><<<blocks, kThreads, 0, stream>>>(c, l);
  }
}

template <Fmt W, bool kBackward>
gpuError_t LaunchPass(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  const bool vec = Vectorizable(l, W);
  if (vec && l.group_len == TeamSlot<2>::kLen) {
    LaunchTeam<W, 2, kBackward>(c, l, stream);
  } else if (vec && l.group_len == TeamSlot<4>::kLen) {
    LaunchTeam<W, 4, kBackward>(c, l, stream);
  } else if (vec && l.group_len == TeamSlot<8>::kLen) {
    LaunchTeam<W, 8, kBackward>(c, l, stream);
  } else if (vec && l.group_len == TeamSlot<16>::kLen) {
    LaunchTeam<W, 16, kBackward>(c, l, stream);
  } else if (vec && l.group_len == TeamSlot<32>::kLen) {
    LaunchTeam<W, 32, kBackward>(c, l, stream);
  } else if (kBackward) {
    BackwardKernel<W><<<Blocks(l.groups(), kGroupsPerBlock), kThreads, 0, stream>>>(c, l, vec);
  } else {
    ForwardKernel<W><<<Blocks(l.groups(), kGroupsPerBlock), kThreads, 0, stream>>>(c, l, vec);
  }
  return gpuGetLastError();
}

template <bool kBackward>
gpuError_t LaunchPass(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  if (c.weight == Fmt::kF32) return LaunchPass<Fmt::kF32, kBackward>(c, l, stream);
  if (c.weight == Fmt::kBf16) return LaunchPass<Fmt::kBf16, kBackward>(c, l, stream);
  return LaunchPass<Fmt::kF16, kBackward>(c, l, stream);
}

// How many experts (tensors, for a step) one launch's parameters hold: HIP takes 4 KiB of
// them, CUDA 32764 bytes (sm_70 on, CUDA 12.1 on, as the pull kernel's).
#if defined(QLINK_GPU_HIP)
constexpr int kExpertsPerLaunch = 24;
constexpr int kStepTensorsPerLaunch = 96;
constexpr size_t kParamBytes = 4096;
#else
constexpr int kExpertsPerLaunch = 224;
constexpr int kStepTensorsPerLaunch = 768;
constexpr size_t kParamBytes = 32764;
#endif
constexpr int64_t kStepBlocks = 16384;  // blocks of one experts' step launch, over all its tensors
using Experts = ExpertTable<kExpertsPerLaunch>;
using StepTensors = StepTable<kStepTensorsPerLaunch>;
static_assert(sizeof(SignRoundConfig) + sizeof(Experts) + sizeof(bool) <= kParamBytes, "experts' launch parameters");
static_assert(sizeof(StepTensors) + 3 * sizeof(void*) <= kParamBytes, "step tensors' launch parameters");

template <Fmt W, int kTeam, bool kBackward>
void LaunchExpertsTeam(const SignRoundConfig& c, const Experts& t, dim3 grid, gpuStream_t stream) {
  if (c.sym) {
    ExpertsTeamKernel<W, kTeam, kBackward, true, kExpertsPerLaunch><<<grid, kThreads, 0, stream>>>(c, t);
  } else {
    ExpertsTeamKernel<W, kTeam, kBackward, false, kExpertsPerLaunch><<<grid, kThreads, 0, stream>>>(c, t);
  }
}

// The experts' pass as one layer's would run (the same kernel body, team or generic, so
// each expert's result is the one-layer launch's), kExpertsPerLaunch experts a launch.
template <Fmt W, bool kBackward>
gpuError_t LaunchExpertsPass(const SignRoundConfig& c, const SignRoundExperts& e, gpuStream_t stream) {
  const SignRoundLayer& first = e.layers[0];
  bool vec = true;
  for (size_t i = 0; i < e.count; ++i) vec = vec && Vectorizable(e.layers[i], W);
  int team = 0;
  if (vec) {
    for (int k : {2, 4, 8, 16, 32}) team = first.group_len == int64_t(kHeld) * k * kChunk ? k : team;
  }
  auto table = std::make_unique<Experts>();  // 30 KiB on CUDA: not on the stack
  table->tokens = e.tokens;
  for (size_t at = 0; at < e.count; at += kExpertsPerLaunch) {
    const size_t n = std::min<size_t>(e.count - at, kExpertsPerLaunch);
    std::copy(e.layers + at, e.layers + at + n, table->layers);
    table->first = static_cast<uint32_t>(at);
    const dim3 grid(Blocks(first.groups(), team != 0 ? kThreads / team : kGroupsPerBlock), static_cast<unsigned>(n));
    switch (team) {
      case 2:
        LaunchExpertsTeam<W, 2, kBackward>(c, *table, grid, stream);
        break;
      case 4:
        LaunchExpertsTeam<W, 4, kBackward>(c, *table, grid, stream);
        break;
      case 8:
        LaunchExpertsTeam<W, 8, kBackward>(c, *table, grid, stream);
        break;
      case 16:
        LaunchExpertsTeam<W, 16, kBackward>(c, *table, grid, stream);
        break;
      case 32:
        LaunchExpertsTeam<W, 32, kBackward>(c, *table, grid, stream);
        break;
      default:
        ExpertsKernel<W, kBackward, kExpertsPerLaunch><<<grid, kThreads, 0, stream>>>(c, *table, vec);
    }
    const gpuError_t error = gpuGetLastError();
    if (error != gpuSuccess) return error;
  }
  return gpuSuccess;
}

template <bool kBackward>
gpuError_t LaunchExpertsPass(const SignRoundConfig& c, const SignRoundExperts& e, gpuStream_t stream) {
  if (e.count == 0) return gpuSuccess;
  if (c.weight == Fmt::kF32) return LaunchExpertsPass<Fmt::kF32, kBackward>(c, e, stream);
  if (c.weight == Fmt::kBf16) return LaunchExpertsPass<Fmt::kBf16, kBackward>(c, e, stream);
  return LaunchExpertsPass<Fmt::kF16, kBackward>(c, e, stream);
}

}  // namespace

gpuError_t LaunchSignRoundForward(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  return LaunchPass<false>(c, l, stream);
}

gpuError_t LaunchSignRoundBackward(const SignRoundConfig& c, const SignRoundLayer& l, gpuStream_t stream) {
  return LaunchPass<true>(c, l, stream);
}

gpuError_t LaunchSignSgdTensor(const SignSgdStep& s, const SignSgdTensor& t, gpuStream_t stream) {
  if (t.count == 0) return gpuSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((t.count + kThreads - 1) / kThreads, 4096));
  SignSgdKernel<<<blocks, kThreads, 0, stream>>>(t.param, t.grad, t.best, t.count, s.lrs + t.lr_group, s.loss,
                                                 s.best_loss);
  return gpuGetLastError();
}

gpuError_t LaunchSignRoundExpertsForward(const SignRoundConfig& c, const SignRoundExperts& e, gpuStream_t stream) {
  return LaunchExpertsPass<false>(c, e, stream);
}

gpuError_t LaunchSignRoundExpertsBackward(const SignRoundConfig& c, const SignRoundExperts& e, gpuStream_t stream) {
  return LaunchExpertsPass<true>(c, e, stream);
}

gpuError_t LaunchSignSgdExperts(const SignSgdStep& s, size_t num_experts, const ExpertTokens& tokens,
                                gpuStream_t stream) {
  if (s.num_tensors == 0) return gpuSuccess;
  int64_t longest = 0;
  for (size_t t = 0; t < s.num_tensors; ++t) longest = std::max(longest, s.tensors[t].count);
  if (longest == 0) return gpuSuccess;
  // Every tensor gets the longest one's blocks, within a budget for the launch: a block's
  // experts mix v (as large as the weight) with range factors a group_len of it, whose
  // blocks past their end exit at once.
  const int64_t budget =
      std::max<int64_t>(1, kStepBlocks / static_cast<int64_t>(std::min<size_t>(s.num_tensors, kStepTensorsPerLaunch)));
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>({(longest + kThreads - 1) / kThreads, 4096, budget}));
  auto table = std::make_unique<StepTensors>();
  table->tokens = tokens;
  table->per_expert = static_cast<uint32_t>(s.num_tensors / num_experts);
  for (size_t at = 0; at < s.num_tensors; at += kStepTensorsPerLaunch) {
    const size_t n = std::min<size_t>(s.num_tensors - at, kStepTensorsPerLaunch);
    std::copy(s.tensors + at, s.tensors + at + n, table->tensors);
    table->first = static_cast<uint32_t>(at);
    SignSgdExpertsKernel<kStepTensorsPerLaunch>
        <<<dim3(blocks, static_cast<unsigned>(n)), kThreads, 0, stream>>>(*table, s.lrs, s.loss, s.best_loss);
    const gpuError_t error = gpuGetLastError();
    if (error != gpuSuccess) return error;
  }
  return gpuSuccess;
}

gpuError_t LaunchSignSgdSchedule(const SignSgdStep& s, gpuStream_t stream) {
  ScheduleKernel<<<1, 1, 0, stream>>>(s);
  return gpuGetLastError();
}

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
