#include "quant/kernels/gptq_kernels.h"

#include <algorithm>
#include <cfloat>

#include "backends/gpu/gpu_device.h"
#include "quant/kernels/gptq_math.h"
#include "quant/kernels/gpu_team.h"

namespace qlink {
namespace quant {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Group ranges: a team of 32 lanes per (row, group).
constexpr int kRangeTeam = 32;
constexpr int kRangeTeamsPerBlock = kThreads / kRangeTeam;
// The column loop: a team of 8 lanes per row, 16 of the block's columns in each lane's
// registers (with their ranges), 4 rows a warp, 32 rows a launch block. The launch
// block's 64 KiB square of U and its registers allow three per SM; measured on an H200
// against teams of 4 and 16 and blocks of 128 threads, this shape keeps the most steps in
// flight. A lane's columns come in quads, so U's row reaches it four values to a read.
constexpr int kTeam = 8;
constexpr int kQuad = 4;
constexpr int kSlots = kBlockColumns / kTeam;  // columns per lane
constexpr int kQuadsPerLane = kSlots / kQuad;  // quad m of lane l: 32 m + 4 l .. + 3
constexpr int kLoopThreads = 256;
constexpr int kLoopRows = kLoopThreads / kTeam;

__device__ __forceinline__ int LaneColumn(int lane, int k) {
  return (k / kQuad) * kTeam * kQuad + lane * kQuad + k % kQuad;
}

__device__ __forceinline__ int64_t At(const int32_t* perm, int64_t c) { return perm != nullptr ? perm[c] : c; }

unsigned Blocks(int64_t work, int64_t per_block = kThreads) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((work + per_block - 1) / per_block, 1), 65535));
}

#define QLINK_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Element (r, c) of a rows x cols matrix for each thread of a 2-D launch (Grid2D): no
// division per element.
#define QLINK_ROWS_COLS(r, c, rows, cols)                                                     \
  for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)                                    \
    for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < (cols); \
         c += int64_t(gridDim.x) * blockDim.x)

dim3 Grid2D(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>(std::min<int64_t>((cols + kThreads - 1) / kThreads, 1024)),
              static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(rows, 1), 65535)));
}

__global__ void DiagonalKernel(const float* h, int64_t n, float* out) { QLINK_GRID_STRIDE(i, n) out[i] = h[i * n + i]; }

__global__ void ReverseKernel(const float* in, float* out, int64_t count) {
  QLINK_GRID_STRIDE(i, count) out[i] = in[count - 1 - i];
}

// Column-major H[p][:, p]: row j of `out` is column j.
__global__ void PrepareHessianKernel(const float* h, int64_t n, const int32_t* perm, float diag_add, float* out) {
  QLINK_ROWS_COLS(j, i, n, n) {
    float v = h[At(perm, i) * n + At(perm, j)];
    if (i == j) v = (v == 0.0f ? 1.0f : v) + diag_add;
    out[j * n + i] = v;
  }
}

__global__ void IdentityKernel(float* a, int64_t n) { QLINK_ROWS_COLS(r, c, n, n) a[r * n + c] = r == c ? 1.0f : 0.0f; }

// Row-major view M[r][c] = a[r * n + c]. Column-major lower_to_upper fills M's lower
// triangle (r > c) from its upper one; the reverse fills the upper. 32 x 32 tiles through
// shared memory, so both the reads and the writes are coalesced.
__global__ void MirrorKernel(float* a, int64_t n, bool fill_lower) {
  __shared__ float tile[32][33];
  const int64_t tr = blockIdx.y, tc = blockIdx.x;  // destination tile
  if (fill_lower ? tr < tc : tr > tc) return;
  // Source tile (tc, tr): read it row by row, coalesced along its columns.
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t r = tc * 32 + y, c = tr * 32 + threadIdx.x;
    if (r < n && c < n) tile[y][threadIdx.x] = a[r * n + c];
  }
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t r = tr * 32 + y, c = tc * 32 + threadIdx.x;
    if (r < n && c < n && (fill_lower ? r > c : r < c)) a[r * n + c] = tile[threadIdx.x][y];
  }
}

__global__ void LoadWeightKernel(const void* w, int code, int bits, int64_t rows, int64_t cols, const int32_t* perm,
                                 float* out) {
  QLINK_ROWS_COLS(r, c, rows, cols) out[r * cols + c] = LoadElement(w, code, bits, r * cols + At(perm, c));
}

__global__ void StoreWeightKernel(const float* w, int64_t rows, int64_t cols, const int32_t* position, int code,
                                  int bits, void* out) {
  QLINK_ROWS_COLS(r, c, rows, cols) StoreElement(out, code, bits, r * cols + c, w[r * cols + At(position, c)]);
}

__global__ void StoreCodesKernel(const uint8_t* codes, int64_t rows, int64_t cols, const int32_t* position,
                                 uint8_t* out) {
  QLINK_ROWS_COLS(r, c, rows, cols) out[r * cols + c] = codes[r * cols + At(position, c)];
}

__global__ void ZeroColumnsKernel(float* w, int64_t rows, int64_t ld, const int32_t* columns, int64_t count) {
  QLINK_ROWS_COLS(r, k, rows, count) w[r * ld + columns[k]] = 0.0f;
}

__global__ void ToFloatKernel(const void* x, int code, int bits, int64_t count, float* out) {
  QLINK_GRID_STRIDE(i, count) out[i] = LoadElement(x, code, bits, i);
}

// One team per (row, group): min and max over the group's columns, then the range.
__global__ void GroupRangesKernel(const float* w, int64_t rows, int64_t ld, int64_t group_size, int64_t first_group,
                                  const int32_t* columns, int bits, bool sym, float* scales, float* zeros,
                                  int64_t groups) {
  const int lane = threadIdx.x % kRangeTeam;
  const int64_t r = blockIdx.y * static_cast<int64_t>(kRangeTeamsPerBlock) + threadIdx.x / kRangeTeam;
  const int64_t g = first_group + blockIdx.x;
  const bool active = r < rows;
  const float* row = w + (active ? r : 0) * ld;
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int64_t j = lane; j < group_size; j += kRangeTeam) {
    const int64_t c = g * group_size + j;
    const float v = row[columns != nullptr ? columns[c] : c];
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  for (int mask = kRangeTeam / 2; mask > 0; mask /= 2) {
    lo = fminf(lo, TeamXor(lo, mask, kRangeTeam));
    hi = fmaxf(hi, TeamXor(hi, mask, kRangeTeam));
  }
  if (active && lane == 0) {
    RangeToParams(lo, hi, (1 << bits) - 1, sym, &scales[r * groups + g], &zeros[r * groups + g]);
  }
}

// GPTQ's column loop over one block, one team per row. The block's square of U sits in
// shared memory, below its diagonal zeroed (a lane's column already done in the current
// quad takes a zero update). Step i: column i's owner hands its value and range to the
// team, every lane quantizes it alike and updates its columns of the current quad and
// later ones with U's row i; earlier quads are done and are not touched. The owner keeps
// the dequantized value, the error and the level in registers until the block ends.
constexpr size_t kBlockSharedBytes = sizeof(float) * kBlockColumns * kBlockColumns + sizeof(int32_t) * kBlockColumns;

__global__ void __launch_bounds__(kLoopThreads) QuantizeBlockKernel(const BlockArgs a) {
  extern __shared__ float4 shared[];
  float* u_block = reinterpret_cast<float*>(shared);  // kBlockColumns x kBlockColumns, row-major
  int32_t* group = reinterpret_cast<int32_t*>(u_block + kBlockColumns * kBlockColumns);
  const float* u_rows = a.u + a.first * a.n + a.first;
  const bool vector_rows = a.n % 4 == 0 && reinterpret_cast<uintptr_t>(a.u) % 16 == 0;
#pragma unroll 8
  for (int k = threadIdx.x; k < kBlockColumns * kBlockColumns / 4; k += blockDim.x) {
    const int i = k / (kBlockColumns / 4), j = (k % (kBlockColumns / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < a.count && j < a.count && j + 3 >= i) {
      const float* src = u_rows + i * a.n + j;
      if (vector_rows && j + 4 <= a.count) {
        v = *reinterpret_cast<const float4*>(src);
      } else {
        v.x = src[0];
        if (j + 1 < a.count) v.y = src[1];
        if (j + 2 < a.count) v.z = src[2];
        if (j + 3 < a.count) v.w = src[3];
      }
      if (j < i) v.x = 0.0f;
      if (j + 1 < i) v.y = 0.0f;
      if (j + 2 < i) v.z = 0.0f;
    }
    shared[k] = v;
  }
  for (int j = threadIdx.x; j < kBlockColumns; j += blockDim.x)
    group[j] = j < a.count ? a.column_group[a.first + j] : 0;
  __syncthreads();
  const int lane = threadIdx.x % kTeam;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kLoopRows) + threadIdx.x / kTeam;
  const bool active = r < a.rows;
  const int64_t row_index = active ? r : 0;
  const int maxq = (1 << a.grid.bits) - 1;
  float* row = a.w + row_index * a.ld + a.first;
  const float* scales = a.scales + row_index * a.groups;
  const float* zeros = a.zeros + row_index * a.groups;
  float w[kSlots], scale[kSlots], zero[kSlots], err[kSlots];
  uint32_t levels[kQuadsPerLane];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int c = LaneColumn(lane, k);
    const bool in = c < a.count;
    w[k] = in ? row[c] : 0.0f;
    scale[k] = in ? scales[group[c]] : 1.0f;
    zero[k] = in ? zeros[group[c]] : 0.0f;
    err[k] = 0.0f;
    if (k % kQuad == 0) levels[k / kQuad] = 0;
  }
#pragma unroll
  for (int m = 0; m < kQuadsPerLane; ++m) {
    for (int owner = 0; owner < kTeam; ++owner) {
#pragma unroll
      for (int t = 0; t < kQuad; ++t) {
        const int i = m * kTeam * kQuad + owner * kQuad + t;
        if (i < a.count) {  // the same for every lane of the launch
          const float4* u = shared + i * (kBlockColumns / 4);
          const float x = TeamShuffle(w[m * kQuad + t], owner, kTeam);
          const float s = TeamShuffle(scale[m * kQuad + t], owner, kTeam);
          const float z = TeamShuffle(zero[m * kQuad + t], owner, kTeam);
          uint8_t l = 0;
          const float q = QuantizeValue(x, s, z, maxq, &l);
          const float e = (x - q) / u_block[i * kBlockColumns + i];
#pragma unroll
          for (int mm = m; mm < kQuadsPerLane; ++mm) {
            const float4 v = u[mm * kTeam + lane];
            w[mm * kQuad + 0] = Sub(w[mm * kQuad + 0], Mul(e, v.x));
            w[mm * kQuad + 1] = Sub(w[mm * kQuad + 1], Mul(e, v.y));
            w[mm * kQuad + 2] = Sub(w[mm * kQuad + 2], Mul(e, v.z));
            w[mm * kQuad + 3] = Sub(w[mm * kQuad + 3], Mul(e, v.w));
          }
          if (lane == owner) {
            w[m * kQuad + t] = q;
            err[m * kQuad + t] = e;
            levels[m] |= static_cast<uint32_t>(l) << (8 * t);
          }
        }
      }
    }
  }
  double loss = 0;  // the row's sum of err^2 = (w - q)^2 / d^2, each lane's columns first
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int c = LaneColumn(lane, k);
    if (!active || c >= a.count) continue;
    row[c] = w[k];
    a.err[r * a.count + c] = err[k];
    if (a.codes != nullptr)
      a.codes[r * a.ld + a.first + c] = static_cast<uint8_t>(levels[k / kQuad] >> (8 * (k % kQuad)));
    loss += static_cast<double>(err[k]) * err[k];
  }
  for (int mask = kTeam / 2; mask > 0; mask /= 2) loss += TeamXor(loss, mask, kTeam);  // a fixed tree
  if (active && lane == 0) a.row_loss[r] += loss;
}

}  // namespace

gpuError_t LaunchDiagonal(const float* h, int64_t n, float* out, gpuStream_t stream) {
  DiagonalKernel<<<Blocks(n), kThreads, 0, stream>>>(h, n, out);
  return gpuGetLastError();
}

gpuError_t LaunchPrepareHessian(const float* h, int64_t n, const int32_t* perm, float diag_add, float* out,
                                gpuStream_t stream) {
  PrepareHessianKernel<<<Grid2D(n, n), kThreads, 0, stream>>>(h, n, perm, diag_add, out);
  return gpuGetLastError();
}

gpuError_t LaunchIdentity(float* a, int64_t n, gpuStream_t stream) {
  IdentityKernel<<<Grid2D(n, n), kThreads, 0, stream>>>(a, n);
  return gpuGetLastError();
}

gpuError_t LaunchMirrorTriangle(float* a, int64_t n, bool lower_to_upper, gpuStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((n + 31) / 32);
  MirrorKernel<<<dim3(tiles, tiles), dim3(32, 8), 0, stream>>>(a, n, lower_to_upper);
  return gpuGetLastError();
}

gpuError_t LaunchReverse(const float* in, float* out, int64_t count, gpuStream_t stream) {
  ReverseKernel<<<Blocks(count), kThreads, 0, stream>>>(in, out, count);
  return gpuGetLastError();
}

gpuError_t LaunchLoadWeight(const void* w, DLDataType dtype, int64_t rows, int64_t cols, const int32_t* perm,
                            float* out, gpuStream_t stream) {
  LoadWeightKernel<<<Grid2D(rows, cols), kThreads, 0, stream>>>(w, dtype.code, dtype.bits, rows, cols, perm, out);
  return gpuGetLastError();
}

gpuError_t LaunchStoreWeight(const float* w, int64_t rows, int64_t cols, const int32_t* position, DLDataType dtype,
                             void* out, gpuStream_t stream) {
  StoreWeightKernel<<<Grid2D(rows, cols), kThreads, 0, stream>>>(w, rows, cols, position, dtype.code, dtype.bits, out);
  return gpuGetLastError();
}

gpuError_t LaunchStoreCodes(const uint8_t* codes, int64_t rows, int64_t cols, const int32_t* position, uint8_t* out,
                            gpuStream_t stream) {
  StoreCodesKernel<<<Grid2D(rows, cols), kThreads, 0, stream>>>(codes, rows, cols, position, out);
  return gpuGetLastError();
}

gpuError_t LaunchZeroColumns(float* w, int64_t rows, int64_t ld, const int32_t* columns, int64_t count,
                             gpuStream_t stream) {
  ZeroColumnsKernel<<<Grid2D(rows, count), kThreads, 0, stream>>>(w, rows, ld, columns, count);
  return gpuGetLastError();
}

gpuError_t LaunchGroupRanges(const float* w, int64_t rows, int64_t ld, int64_t group_size, int64_t first_group,
                             int64_t num_groups, const int32_t* columns, Grid grid, float* scales, float* zeros,
                             int64_t groups, gpuStream_t stream) {
  const dim3 blocks(static_cast<unsigned>(num_groups),
                    static_cast<unsigned>((rows + kRangeTeamsPerBlock - 1) / kRangeTeamsPerBlock));
  GroupRangesKernel<<<blocks, kThreads, 0, stream>>>(w, rows, ld, group_size, first_group, columns, grid.bits, grid.sym,
                                                     scales, zeros, groups);
  return gpuGetLastError();
}

gpuError_t LaunchQuantizeBlock(const BlockArgs& args, gpuStream_t stream) {
  // 64.5 KiB of shared memory is past the default 48 KiB a launch may take (per function,
  // for whichever device is current; setting it again is cheap).
#if defined(QLINK_GPU_HIP)
  gpuError_t e = hipFuncSetAttribute(reinterpret_cast<const void*>(&QuantizeBlockKernel),
                                     hipFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBlockSharedBytes));
#else
  gpuError_t e = cudaFuncSetAttribute(QuantizeBlockKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kBlockSharedBytes));
#endif
  if (e != gpuSuccess) return e;
  const unsigned blocks = static_cast<unsigned>((args.rows + kLoopRows - 1) / kLoopRows);
  QuantizeBlockKernel<<<blocks, kLoopThreads, kBlockSharedBytes, stream>>>(args);
  return gpuGetLastError();
}

gpuError_t LaunchToFloat(const void* x, DLDataType dtype, int64_t count, float* out, gpuStream_t stream) {
  ToFloatKernel<<<Blocks(count), kThreads, 0, stream>>>(x, dtype.code, dtype.bits, count, out);
  return gpuGetLastError();
}

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
