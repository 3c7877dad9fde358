#include "quant/kernels/hessian_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>

#include <cstdint>

#include "backends/gpu/gpu_device.h"

namespace qlink {
namespace quant {
namespace gpu {
namespace {

// A 128 x 128 tile of h per block of 4 warps, each warp 64 x 64 of it in m16n8 fragments
// (mma.sync m16n8k16 with ldmatrix; measured on one H200 at 2048-row calls, 22 % faster
// than 8 warps of 64 x 32 through wmma, with the same sums bit for bit). A group of 32
// rows is two MMAs into a zeroed fragment, whose sum then leaves the tensor cores (their
// adds truncate after aligning to the largest exponent, a bias that grows with every MMA
// chained into one accumulator) for an fp32 register add.
constexpr int kTile = 128;
constexpr int kGroup = 32;
constexpr int kDepth = 2 * kGroup;  // rows per shared stage: one barrier per two groups
// Two stages, one read while the next is copied: 68 KB, inside the 99 KB a block may take on
// sm_86 / sm_89 (a third stage, 102 KB, measured 1 % faster on an H200, would not launch there).
constexpr int kStages = 2;
// 16 bytes of padding per shared row: the 8 rows an ldmatrix reads per phase then start
// 4 banks apart, so none of them conflict.
constexpr int kLd = kTile + 8;
constexpr int kWarpsM = 2, kWarpsN = 2;
constexpr int kThreads = kWarpsM * kWarpsN * 32;
constexpr int kWarpRows = kTile / kWarpsM, kWarpCols = kTile / kWarpsN;
constexpr int kRowFrags = kWarpRows / 16, kColFrags = kWarpCols / 8;
constexpr int kChunk = 8;  // 16-bit elements per 16-byte asynchronous copy
constexpr int kChunksPerRow = kTile / kChunk;
constexpr int kStageElements = kDepth * kLd;
// x's rows k0.., columns i0.. (A^T) and j0.. (B) per stage; a diagonal tile reads one.
constexpr size_t kSharedBytes = size_t{2} * kStages * kStageElements * sizeof(uint16_t);

// dst[r][c] = x[k0 + r][c0 + c], zero outside x (n % 8 == 0: a chunk is wholly in or out).
template <typename T>
__device__ __forceinline__ void LoadStage(T* dst, const T* x, int64_t rows, int64_t n, int64_t k0, int64_t c0) {
#pragma unroll
  for (int c = threadIdx.x; c < kDepth * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunk;
    const bool inside = k0 + r < rows && c0 + col < n;
    __pipeline_memcpy_async(dst + r * kLd + col, inside ? x + (k0 + r) * n + c0 + col : x, 16, inside ? 0 : 16);
  }
}

// Four 8 x 8 matrices of 16-bit elements, each row of 8 contiguous in shared memory, as
// their transposes' fragments: stored k-major, they land as the MMA's A (row) and B (col).
__device__ __forceinline__ void LoadTransposed(uint32_t (&r)[4], const void* p) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void Run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
};
template <>
struct Mma<__half> {
  __device__ __forceinline__ static void Run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
};

// One tile (ti >= tj) per block, numbered row by row: blockIdx.x = ti (ti + 1) / 2 + tj.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PromotedSyrkKernel(const T* __restrict__ x, int64_t rows, int64_t n, float* __restrict__ h) {
  extern __shared__ __align__(128) unsigned char shared[];
  T* sa = reinterpret_cast<T*>(shared);
  T* sb = sa + kStages * kStageElements;
  const int b = static_cast<int>(blockIdx.x);
  int ti = static_cast<int>((sqrtf(8.0f * b + 1.0f) - 1.0f) * 0.5f);
  while (ti * (ti + 1) / 2 > b) --ti;
  while ((ti + 1) * (ti + 2) / 2 <= b) ++ti;
  const int tj = b - ti * (ti + 1) / 2;
  const bool diagonal = ti == tj;
  const int64_t i0 = int64_t{ti} * kTile, j0 = int64_t{tj} * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kWarpsN * kWarpRows, wn = warp % kWarpsN * kWarpCols;
  // ldmatrix: lanes 8q..8q+7 give the rows of matrix q.
  const int q = lane / 8, r8 = lane % 8;

  float acc[kRowFrags][kColFrags][4];
#pragma unroll
  for (int mi = 0; mi < kRowFrags; ++mi)
#pragma unroll
    for (int ni = 0; ni < kColFrags; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  const int64_t stages = (rows + kDepth - 1) / kDepth;
  auto load = [&](int64_t stage) {
    const int slot = static_cast<int>(stage % kStages);
    LoadStage(sa + slot * kStageElements, x, rows, n, stage * kDepth, i0);
    if (!diagonal) LoadStage(sb + slot * kStageElements, x, rows, n, stage * kDepth, j0);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) load(s);
    __pipeline_commit();
  }
  for (int64_t t = 0; t < stages; ++t) {
    __pipeline_wait_prior(kStages - 2);
    // Stage t is in; every warp is done reading stage t - 1, whose slot the next copy takes.
    __syncthreads();
    if (t + kStages - 1 < stages) load(t + kStages - 1);
    __pipeline_commit();
    const int slot = static_cast<int>(t % kStages);
    const T* a_rows = sa + slot * kStageElements;
    const T* b_rows = (diagonal ? sa : sb) + slot * kStageElements;
#pragma unroll
    for (int g = 0; g < kDepth / kGroup; ++g) {
      uint32_t a[2][kRowFrags][4], bt[2][kColFrags][2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int k0 = g * kGroup + k * 16;
        // A (m, k) = x[k][i0 + m]: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
#pragma unroll
        for (int mi = 0; mi < kRowFrags; ++mi) {
          LoadTransposed(a[k][mi], a_rows + (k0 + (q >> 1) * 8 + r8) * kLd + wm + mi * 16 + (q & 1) * 8);
        }
        // B (k, n) = x[k][j0 + n]: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), then n 8-15: two fragments.
#pragma unroll
        for (int np = 0; np < kColFrags / 2; ++np) {
          uint32_t m[4];
          LoadTransposed(m, b_rows + (k0 + (q & 1) * 8 + r8) * kLd + wn + np * 16 + (q >> 1) * 8);
          bt[k][2 * np][0] = m[0];
          bt[k][2 * np][1] = m[1];
          bt[k][2 * np + 1][0] = m[2];
          bt[k][2 * np + 1][1] = m[3];
        }
      }
#pragma unroll
      for (int mi = 0; mi < kRowFrags; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kColFrags; ++ni) {
          float part[4];
          Mma<T>::Run(part, a[0][mi], bt[0][ni], zero);
          Mma<T>::Run(part, a[1][mi], bt[1][ni], part);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mi][ni][e] += part[e];
        }
      }
    }
  }

  // Fragment element e of lane (4 g + c) is (row g + 8 [e >= 2], column 2 c + e % 2): each
  // store of a warp covers 8 consecutive floats of 4 columns of h (column-major).
  const int group = lane / 4, pair = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kRowFrags; ++mi)
#pragma unroll
    for (int ni = 0; ni < kColFrags; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = i0 + wm + mi * 16 + group + (e >= 2 ? 8 : 0);
        const int64_t j = j0 + wn + ni * 8 + 2 * pair + (e & 1);
        if (i < n && j < n) h[j * n + i] += acc[mi][ni][e];
      }
}

// The stages take more than the 48 KB of shared memory a kernel gets without asking, asked
// at each launch: the allowance is the current device's.
template <typename T>
gpuError_t Launch(const T* x, int64_t rows, int64_t n, float* h, unsigned blocks, gpuStream_t stream) {
  const gpuError_t allowed = cudaFuncSetAttribute(PromotedSyrkKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(kSharedBytes));
  if (allowed != gpuSuccess) return allowed;
  PromotedSyrkKernel<<<blocks, kThreads, kSharedBytes, stream>>>(x, rows, n, h);
  return gpuGetLastError();
}

}  // namespace

gpuError_t LaunchPromotedSyrk(const void* x, DLDataType dtype, int64_t rows, int64_t n, float* h, gpuStream_t stream) {
  if (rows == 0 || n == 0) return gpuSuccess;
  const int64_t tiles = (n + kTile - 1) / kTile;
  const unsigned blocks = static_cast<unsigned>(tiles * (tiles + 1) / 2);
  if (dtype.code == kDLBfloat) return Launch(static_cast<const __nv_bfloat16*>(x), rows, n, h, blocks, stream);
  return Launch(static_cast<const __half*>(x), rows, n, h, blocks, stream);
}

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
