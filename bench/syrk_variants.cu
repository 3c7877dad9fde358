// XᵀX of 262 144 × 4096 bf16 tokens in IEEE fp32 through cuBLAS, every way the engine's
// Hessian update could be split: what chose hessian_accumulate's two half-size SYRKs and
// one GEMM (bench/RESULTS.md, Quantization). Built and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o /tmp/syrk_variants bench/syrk_variants.cu -lcublas && /tmp/syrk_variants
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#define CK(x)                              \
  do {                                     \
    auto e = (x);                          \
    if (e != 0) {                          \
      printf("fail %s: %d\n", #x, (int)e); \
      return 1;                            \
    }                                      \
  } while (0)
__global__ void tofloat(const __nv_bfloat16* x, size_t n, float* y) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}
int main() {
  const int n = 4096;
  const long K = 262144;
  __nv_bfloat16* xb;
  float *xf, *c;
  CK(cudaMalloc(&xb, K * n * 2));
  CK(cudaMalloc(&xf, K * n * 4));
  CK(cudaMalloc(&c, size_t(n) * n * 4));
  {
    std::vector<__nv_bfloat16> h(size_t(K) * n);
    unsigned s = 1;
    for (auto& v : h) {
      s = s * 1664525u + 1013904223u;
      v = __float2bfloat16(((s >> 8) / 16777216.0f) - 0.5f);
    }
    CK(cudaMemcpy(xb, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  tofloat<<<8192, 256>>>(xb, size_t(K) * n, xf);
  cublasHandle_t b;
  CK(cublasCreate(&b));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const float one = 1;
  auto time = [&](const char* name, auto fn) {
    fn();
    cudaDeviceSynchronize();
    float best = 1e9;
    for (int r = 0; r < 3; ++r) {
      cudaEventRecord(e0);
      fn();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      if (ms < best) best = ms;
    }
    printf("%-60s %8.2f ms  err=%d\n", name, best, (int)cudaGetLastError());
  };
  for (long chunk : {8192L, 32768L, 65536L, 262144L}) {
    char nm[128];
    snprintf(nm, sizeof nm, "Ssyrk lower N, k chunk %ld", chunk);
    time(nm, [&] {
      for (long r = 0; r < K; r += chunk)
        cublasSsyrk(b, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, n, chunk, &one, xf + r * n, n, &one, c, n);
    });
    snprintf(nm, sizeof nm, "Ssyrk upper N, k chunk %ld", chunk);
    time(nm, [&] {
      for (long r = 0; r < K; r += chunk)
        cublasSsyrk(b, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, n, chunk, &one, xf + r * n, n, &one, c, n);
    });
  }
  time("tofloat 32768 x 4096 x 8", [&] {
    for (long r = 0; r < K; r += 32768) tofloat<<<8192, 256>>>(xb + r * n, size_t(32768) * n, xf + r * n);
  });
  time("Sgemm full N T k=262144",
       [&] { cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_T, n, n, K, &one, xf, n, xf, n, &one, c, n); });
  for (int parts : {2, 4, 8}) {
    char nm[128];
    snprintf(nm, sizeof nm, "split %d: Ssyrk diag + Sgemm below, k=262144", parts);
    const int p = n / parts;
    time(nm, [&] {
      for (int i = 0; i < parts; ++i) {
        cublasSsyrk(b, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, p, K, &one, xf + i * p, n, &one,
                    c + size_t(i) * p * n + i * p, n);
        if (i + 1 < parts)
          cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_T, n - (i + 1) * p, p, K, &one, xf + (i + 1) * p, n, xf + i * p, n,
                      &one, c + size_t(i) * p * n + (i + 1) * p, n);
      }
    });
    snprintf(nm, sizeof nm, "split %d: Ssyrk diag + Sgemm square tiles, k=262144", parts);
    time(nm, [&] {
      for (int i = 0; i < parts; ++i) {
        cublasSsyrk(b, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, p, K, &one, xf + i * p, n, &one,
                    c + size_t(i) * p * n + i * p, n);
        for (int j = i + 1; j < parts; ++j)
          cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_T, p, p, K, &one, xf + j * p, n, xf + i * p, n, &one,
                      c + size_t(i) * p * n + j * p, n);
      }
    });
  }
  time("GemmEx bf16->fp32 COMPUTE_32F_PEDANTIC full", [&] {
    cublasGemmEx(b, CUBLAS_OP_N, CUBLAS_OP_T, n, n, K, &one, xb, CUDA_R_16BF, n, xb, CUDA_R_16BF, n, &one, c,
                 CUDA_R_32F, n, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
  });
  cublasSetMathMode(b, CUBLAS_PEDANTIC_MATH);
  time("Ssyrk lower N k=262144, PEDANTIC math",
       [&] { cublasSsyrk(b, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, n, K, &one, xf, n, &one, c, n); });
  cublasSetMathMode(b, CUBLAS_TF32_TENSOR_OP_MATH);
  time("(not IEEE) Ssyrk TF32 k=262144",
       [&] { cublasSsyrk(b, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, n, K, &one, xf, n, &one, c, n); });
  return 0;
}
