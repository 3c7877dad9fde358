#include "quant/kernels/hessian_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>

#include "backends/gpu/gpu_device.h"

namespace qlink {
namespace quant {
namespace gpu {
namespace {

namespace wmma = nvcuda::wmma;

// A 128 x 128 tile of h per block of 8 warps, each warp 64 x 32 of it in 16 x 16
// fragments. A k-tile is 32 rows: two MMAs into a zeroed fragment, whose sum then leaves
// the tensor cores (their adds truncate after aligning to the largest exponent, a bias
// that grows with every MMA chained into one accumulator) for an fp32 register add.
constexpr int kTile = 128;
constexpr int kDepth = 32;
constexpr int kFrag = 16;
constexpr int kSteps = kDepth / kFrag;
// 16 bytes of padding per shared row: the 8 rows a fragment load reads per phase then
// start 4 banks apart, so none of them conflict.
constexpr int kLd = kTile + 8;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 64, kWarpCols = 32;
constexpr int kWarpsAcross = kTile / kWarpCols;
constexpr int kFragRows = kWarpRows / kFrag, kFragCols = kWarpCols / kFrag;
constexpr int kChunk = 8;  // 16-bit elements per 16-byte asynchronous copy
constexpr int kChunksPerRow = kTile / kChunk;

// dst[r][c] = x[k0 + r][c0 + c], zero outside x (n % 8 == 0: a chunk is wholly in or out).
template <typename T>
__device__ __forceinline__ void LoadTile(T (*dst)[kLd], const T* x, int64_t rows, int64_t n, int64_t k0, int64_t c0) {
  for (int c = threadIdx.x; c < kDepth * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunk;
    const bool inside = k0 + r < rows && c0 + col < n;
    __pipeline_memcpy_async(&dst[r][col], inside ? x + (k0 + r) * n + c0 + col : x, 16, inside ? 0 : 16);
  }
}

// One tile (ti >= tj) per block, numbered row by row: blockIdx.x = ti (ti + 1) / 2 + tj.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PromotedSyrkKernel(const T* __restrict__ x, int64_t rows, int64_t n, float* __restrict__ h) {
  __shared__ __align__(128) T sa[2][kDepth][kLd];  // x's rows k0.., columns i0..: A^T
  __shared__ __align__(128) T sb[2][kDepth][kLd];  // columns j0..: B
  __shared__ __align__(128) float staged[kWarps][kFrag * kFrag];
  const int b = static_cast<int>(blockIdx.x);
  int ti = static_cast<int>((sqrtf(8.0f * b + 1.0f) - 1.0f) * 0.5f);
  while (ti * (ti + 1) / 2 > b) --ti;
  while ((ti + 1) * (ti + 2) / 2 <= b) ++ti;
  const int tj = b - ti * (ti + 1) / 2;
  const int64_t i0 = int64_t{ti} * kTile, j0 = int64_t{tj} * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kWarpsAcross * kWarpRows, wn = warp % kWarpsAcross * kWarpCols;

  wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc[kFragRows][kFragCols], part;
  for (int mi = 0; mi < kFragRows; ++mi)
    for (int ni = 0; ni < kFragCols; ++ni) wmma::fill_fragment(acc[mi][ni], 0.0f);

  const int64_t tiles = (rows + kDepth - 1) / kDepth;
  LoadTile(sa[0], x, rows, n, 0, i0);
  LoadTile(sb[0], x, rows, n, 0, j0);
  __pipeline_commit();
  for (int64_t t = 0; t < tiles; ++t) {
    const int s = static_cast<int>(t & 1);
    if (t + 1 < tiles) {
      LoadTile(sa[s ^ 1], x, rows, n, (t + 1) * kDepth, i0);
      LoadTile(sb[s ^ 1], x, rows, n, (t + 1) * kDepth, j0);
      __pipeline_commit();
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    // A (m, k) = sa[k][m]: column-major; B (k, n) = sb[k][n]: row-major.
    wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::col_major> a[kFragRows][kSteps];
    wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::row_major> bt[kFragCols][kSteps];
    for (int k = 0; k < kSteps; ++k) {
      for (int mi = 0; mi < kFragRows; ++mi) wmma::load_matrix_sync(a[mi][k], &sa[s][k * kFrag][wm + mi * kFrag], kLd);
      for (int ni = 0; ni < kFragCols; ++ni) wmma::load_matrix_sync(bt[ni][k], &sb[s][k * kFrag][wn + ni * kFrag], kLd);
    }
    for (int mi = 0; mi < kFragRows; ++mi) {
      for (int ni = 0; ni < kFragCols; ++ni) {
        wmma::fill_fragment(part, 0.0f);
        for (int k = 0; k < kSteps; ++k) wmma::mma_sync(part, a[mi][k], bt[ni][k], part);
        for (int e = 0; e < part.num_elements; ++e) acc[mi][ni].x[e] += part.x[e];
      }
    }
    __syncthreads();  // before the next iteration's copies overwrite this buffer
  }

  // A fragment's element order in registers is unspecified: each goes through shared
  // memory, column-major like h, so a half-warp adds 16 consecutive floats of a column.
  float* stage = staged[warp];
  for (int mi = 0; mi < kFragRows; ++mi) {
    for (int ni = 0; ni < kFragCols; ++ni) {
      wmma::store_matrix_sync(stage, acc[mi][ni], kFrag, wmma::mem_col_major);
      __syncwarp();
      for (int e = lane; e < kFrag * kFrag; e += 32) {
        const int64_t i = i0 + wm + mi * kFrag + e % kFrag, j = j0 + wn + ni * kFrag + e / kFrag;
        if (i < n && j < n) h[j * n + i] += stage[e];
      }
      __syncwarp();
    }
  }
}

}  // namespace

gpuError_t LaunchPromotedSyrk(const void* x, DLDataType dtype, int64_t rows, int64_t n, float* h, gpuStream_t stream) {
  if (rows == 0 || n == 0) return gpuSuccess;
  const int64_t tiles = (n + kTile - 1) / kTile;
  const unsigned blocks = static_cast<unsigned>(tiles * (tiles + 1) / 2);
  if (dtype.code == kDLBfloat) {
    PromotedSyrkKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), rows, n, h);
  } else {
    PromotedSyrkKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(x), rows, n, h);
  }
  return gpuGetLastError();
}

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
