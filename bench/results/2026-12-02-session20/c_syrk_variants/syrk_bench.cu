// Variants of qlink's promoted Hessian kernel (lower triangle of h += x^T x, bf16 x, every
// 32 rows' tensor-core sum added into fp32 with an IEEE add), timed on the loop's shape
// (calls of 2048 rows, 128 distinct buffers) and compared bitwise with the library's kernel.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                              \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)
typedef __nv_bfloat16 T;

namespace v0 {
namespace wmma = nvcuda::wmma;
constexpr int kTile = 128, kDepth = 32, kFrag = 16, kSteps = kDepth / kFrag, kLd = kTile + 8, kWarps = 8,
              kThreads = kWarps * 32, kWarpRows = 64, kWarpCols = 32, kWarpsAcross = kTile / kWarpCols,
              kFragRows = kWarpRows / kFrag, kFragCols = kWarpCols / kFrag, kChunk = 8, kChunksPerRow = kTile / kChunk;
__device__ __forceinline__ void LoadTile(T (*dst)[kLd], const T* x, int64_t rows, int64_t n, int64_t k0, int64_t c0) {
  for (int c = threadIdx.x; c < kDepth * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunk;
    const bool inside = k0 + r < rows && c0 + col < n;
    __pipeline_memcpy_async(&dst[r][col], inside ? x + (k0 + r) * n + c0 + col : x, 16, inside ? 0 : 16);
  }
}
__global__ void __launch_bounds__(kThreads) K(const T* __restrict__ x, int64_t rows, int64_t n, float* __restrict__ h) {
  __shared__ __align__(128) T sa[2][kDepth][kLd];
  __shared__ __align__(128) T sb[2][kDepth][kLd];
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
    __syncthreads();
  }
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
void Launch(const T* x, int64_t rows, int64_t n, float* h, cudaStream_t s) {
  const int64_t tiles = (n + kTile - 1) / kTile;
  K<<<(unsigned)(tiles * (tiles + 1) / 2), kThreads, 0, s>>>(x, rows, n, h);
}
}  // namespace v0

namespace v1 {
// Raw mma.sync.m16n8k16 and ldmatrix; kWarpsM x kWarpsN warps tile a 128 x 128 block tile;
// shared stages of kDepth rows (a multiple of 32), kStages deep, one barrier per stage.
constexpr int kTile = 128, kLd = kTile + 8;
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const T* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                    const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
template <int kThreads, int kDepth>
__device__ __forceinline__ void LoadStage(T* dst, const T* x, int64_t rows, int64_t n, int64_t k0, int64_t c0) {
  constexpr int kChunks = kTile / 8;
#pragma unroll
  for (int c = threadIdx.x; c < kDepth * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool inside = k0 + r < rows && c0 + col < n;
    __pipeline_memcpy_async(dst + r * kLd + col, inside ? x + (k0 + r) * n + c0 + col : x, 16, inside ? 0 : 16);
  }
}
template <int kWarpsM, int kWarpsN, int kDepth, int kStages, bool kSkipDiag>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32)
    K(const T* __restrict__ x, int64_t rows, int64_t n, float* __restrict__ h) {
  constexpr int kThreads = kWarpsM * kWarpsN * 32;
  constexpr int kWM = kTile / kWarpsM, kWN = kTile / kWarpsN, kMT = kWM / 16, kNT = kWN / 8;
  constexpr int kStage = kDepth * kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);
  T* sb = sa + kStages * kStage;
  const int b = static_cast<int>(blockIdx.x);
  int ti = static_cast<int>((sqrtf(8.0f * b + 1.0f) - 1.0f) * 0.5f);
  while (ti * (ti + 1) / 2 > b) --ti;
  while ((ti + 1) * (ti + 2) / 2 <= b) ++ti;
  const int tj = b - ti * (ti + 1) / 2;
  const bool diag = kSkipDiag && ti == tj;
  const int64_t i0 = int64_t{ti} * kTile, j0 = int64_t{tj} * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kWarpsN * kWM, wn = warp % kWarpsN * kWN;
  const int q = lane / 8, r8 = lane % 8;
  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int64_t tiles = (rows + kDepth - 1) / kDepth;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) {
      LoadStage<kThreads, kDepth>(sa + s * kStage, x, rows, n, s * kDepth, i0);
      if (!diag) LoadStage<kThreads, kDepth>(sb + s * kStage, x, rows, n, s * kDepth, j0);
    }
    __pipeline_commit();
  }
  for (int64_t t = 0; t < tiles; ++t) {
    __pipeline_wait_prior(kStages - 2);
    __syncthreads();
    const int64_t next = t + kStages - 1;
    if (next < tiles) {
      const int slot = static_cast<int>(next % kStages);
      LoadStage<kThreads, kDepth>(sa + slot * kStage, x, rows, n, next * kDepth, i0);
      if (!diag) LoadStage<kThreads, kDepth>(sb + slot * kStage, x, rows, n, next * kDepth, j0);
    }
    __pipeline_commit();
    const int slot = static_cast<int>(t % kStages);
    const T* A = sa + slot * kStage;
    const T* B = (diag ? sa : sb) + slot * kStage;
#pragma unroll
    for (int kk = 0; kk < kDepth / 32; ++kk) {
      uint32_t af[2][kMT][4], bf[2][kNT][2];
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int k0 = kk * 32 + ks * 16;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          Ldsm4T(af[ks][mt], A + (k0 + (q >> 1) * 8 + r8) * kLd + wm + mt * 16 + (q & 1) * 8);
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t t4[4];
          Ldsm4T(t4, B + (k0 + (q & 1) * 8 + r8) * kLd + wn + np * 16 + (q >> 1) * 8);
          bf[ks][2 * np][0] = t4[0];
          bf[ks][2 * np][1] = t4[1];
          bf[ks][2 * np + 1][0] = t4[2];
          bf[ks][2 * np + 1][1] = t4[3];
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float p[4];
          Mma(p, af[0][mt], bf[0][nt][0], bf[0][nt][1], zero);
          Mma(p, af[1][mt], bf[1][nt][0], bf[1][nt][1], p);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] += p[e];
        }
      }
    }
  }
  const int g = lane / 4, tig = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = i0 + wm + mt * 16 + g + (e >= 2 ? 8 : 0), j = j0 + wn + nt * 8 + 2 * tig + (e & 1);
        if (i < n && j < n) h[j * n + i] += acc[mt][nt][e];
      }
}
template <int kWarpsM, int kWarpsN, int kDepth, int kStages, bool kSkipDiag>
void Launch(const T* x, int64_t rows, int64_t n, float* h, cudaStream_t s) {
  const size_t smem = size_t{2} * kStages * kDepth * kLd * sizeof(T);
  auto* f = K<kWarpsM, kWarpsN, kDepth, kStages, kSkipDiag>;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    set = true;
  }
  const int64_t tiles = (n + kTile - 1) / kTile;
  f<<<(unsigned)(tiles * (tiles + 1) / 2), kWarpsM * kWarpsN * 32, smem, s>>>(x, rows, n, h);
}
}  // namespace v1

static cublasHandle_t g_blas;
// The full product through cuBLAS (bf16 in, fp32 out and compute): the library's rate, not the same sums.
void LaunchCublas(const T* x, int64_t rows, int64_t n, float* h, cudaStream_t s) {
  const float one = 1.0f;
  cublasSetStream(g_blas, s);
  if (cublasGemmEx(g_blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)n, (int)n, (int)rows, &one, x, CUDA_R_16BF, (int)n, x,
                   CUDA_R_16BF, (int)n, &one, h, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
    printf("cublas failed\n");
    exit(1);
  }
}
typedef void (*LaunchFn)(const T*, int64_t, int64_t, float*, cudaStream_t);
struct Variant {
  const char* name;
  LaunchFn fn;
};

int main(int argc, char** argv) {
  const int calls = 128, rows = 2048;
  const int dims[2] = {4096, 11008};
  Variant vs[] = {
      {"v0 wmma 8w 64x32 d32 s2", v0::Launch},
      {"v1 mma 8w 64x32 d32 s2", v1::Launch<2, 4, 32, 2, false>},
      {"v1 mma 8w 64x32 d32 s3", v1::Launch<2, 4, 32, 3, false>},
      {"v1 mma 8w 64x32 d64 s2", v1::Launch<2, 4, 64, 2, false>},
      {"v1 mma 8w 64x32 d64 s3", v1::Launch<2, 4, 64, 3, false>},
      {"v1 mma 4w 64x64 d32 s3", v1::Launch<2, 2, 32, 3, false>},
      {"v1 mma 4w 64x64 d64 s2", v1::Launch<2, 2, 64, 2, false>},
      {"v1 mma 4w 64x64 d64 s3", v1::Launch<2, 2, 64, 3, false>},
      {"v1 mma 4w 64x64 d32 s4", v1::Launch<2, 2, 32, 4, false>},
      {"v1 mma 8w 64x32 d64 s3 diag", v1::Launch<2, 4, 64, 3, true>},
      {"v1 mma 4w 64x64 d64 s3 diag", v1::Launch<2, 2, 64, 3, true>},
      {"cublas gemmex full product", LaunchCublas},
  };
  const int nv = sizeof(vs) / sizeof(vs[0]);
  const char* only = argc > 1 ? argv[1] : nullptr;
  if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS) {
    printf("cublasCreate failed\n");
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int di = 0; di < 2; ++di) {
    const int64_t n = dims[di];
    const size_t per = size_t(rows) * n;
    std::vector<T> hx(per * calls);
    std::mt19937 rng(1234 + di);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> scale(n, 1.0f);
    for (int k = 0; k < 6; ++k) scale[rng() % n] = 40.0f;
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = __float2bfloat16(nd(rng) * scale[i % n]);
    T* dx;
    float* dh;
    float* dref;
    CK(cudaMalloc(&dx, hx.size() * sizeof(T)));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dh, n * n * sizeof(float)));
    CK(cudaMalloc(&dref, n * n * sizeof(float)));
    std::vector<float> href(n * n), hh(n * n);
    const double flop = 2.0 * rows * calls * double(n) * n;  // full product's
    for (int v = 0; v < nv; ++v) {
      if (only && v != 0 && !strstr(vs[v].name, only)) continue;
      float best = 1e30f;
      for (int rep = 0; rep < 3; ++rep) {
        CK(cudaMemsetAsync(dh, 0, n * n * sizeof(float), s));
        CK(cudaEventRecord(e0, s));
        for (int c = 0; c < calls; ++c) vs[v].fn(dx + c * per, rows, n, dh, s);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms);
      }
      CK(cudaMemcpy(hh.data(), dh, n * n * sizeof(float), cudaMemcpyDeviceToHost));
      size_t diff = 0, lower = 0;
      if (v == 0) href = hh;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = j; i < n; ++i) {
          ++lower;
          if (memcmp(&hh[j * n + i], &href[j * n + i], 4)) ++diff;
        }
      printf("d=%5ld  %-32s %8.2f ms  %6.1f TFLOP/s full-eq  lower elements differing from v0: %zu of %zu\n", (long)n,
             vs[v].name, best, flop / best / 1e9, diff, lower);
      fflush(stdout);
    }
    CK(cudaFree(dx));
    CK(cudaFree(dh));
    CK(cudaFree(dref));
  }
  return 0;
}
