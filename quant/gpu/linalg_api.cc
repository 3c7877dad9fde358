#include "quant/gpu/linalg_api.h"

#include <vector>

#include "backends/vendor_library.h"

#if defined(QLINK_GPU_CUDA)
#include <cublas_api.h>
#endif

namespace qlink {
namespace quant {
namespace {

#if defined(QLINK_GPU_HIP)
constexpr const char* kVendor = "hip";
constexpr const char* kBlas = "libhipblas.so.2";
constexpr const char* kSolver = "libhipsolver.so.0";
// hipblasOperation_t, hipblasFillMode_t (hipsolverFillMode_t has the same values); then
// hipDataType (HIP_R_32F, _16F, _16BF), HIPBLAS_COMPUTE_32F, HIPBLAS_GEMM_DEFAULT, as
// hipBLAS 2's GemmEx_v2 takes them.
constexpr LinalgApi kEnums{111, 112, 122, 121, 0, 0, 0, 2, 14, 2, 160};
struct Names {
  const char *blas_create = "hipblasCreate", *blas_stream = "hipblasSetStream", *math = nullptr,
             *sgemm = "hipblasSgemm", *gemm_ex = "hipblasGemmEx_v2", *ssyrk = "hipblasSsyrk", *solver_create = "hipsolverDnCreate",
             *solver_stream = "hipsolverDnSetStream", *potrf_size = "hipsolverDnSpotrf_bufferSize",
             *potrf = "hipsolverDnSpotrf", *potrs = "hipsolverDnSpotrs";
};
#else
constexpr const char* kVendor = "cuda";
constexpr const char* kBlas = "libcublas.so.13";
constexpr const char* kSolver = "libcusolver.so.12";
constexpr LinalgApi kEnums{CUBLAS_OP_N,        CUBLAS_OP_T,   CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER,
                           CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH,
                           CUDA_R_32F,          CUDA_R_16F,    CUDA_R_16BF,
                           CUBLAS_COMPUTE_32F,  CUBLAS_GEMM_DEFAULT};
struct Names {
  const char *blas_create = "cublasCreate_v2", *blas_stream = "cublasSetStream_v2", *math = "cublasSetMathMode",
             *sgemm = "cublasSgemm_v2", *gemm_ex = "cublasGemmEx", *ssyrk = "cublasSsyrk_v2", *solver_create = "cusolverDnCreate",
             *solver_stream = "cusolverDnSetStream", *potrf_size = "cusolverDnSpotrf_bufferSize",
             *potrf = "cusolverDnSpotrf", *potrs = "cusolverDnSpotrs";
};
#endif

}  // namespace

Status LoadLinalg(const std::string& blas, const std::string& solver, const LinalgApi** out) {
  const std::string what = std::string(kVendor) + " GPTQ engine's";
  const std::vector<VendorLibrary> libraries = {{blas.empty() ? kBlas : blas, what + " BLAS", "blas_library"},
                                                {solver.empty() ? kSolver : solver, what + " solver", "solver_library"}};
  return LoadVendorLibraries(libraries, kEnums, [](VendorSymbols& take, LinalgApi* a) {
    const Names n;
    take(0, a->BlasCreate, n.blas_create);
    take(0, a->BlasSetStream, n.blas_stream);
    take(0, a->BlasSetMathMode, n.math);
    take(0, a->Sgemm, n.sgemm);
    // Optional: without it (a hipBLAS before GemmEx_v2) the Hessian keeps the IEEE path.
    a->GemmEx = reinterpret_cast<decltype(a->GemmEx)>(take.Find(0, n.gemm_ex));
    take(0, a->Ssyrk, n.ssyrk);
    take(1, a->SolverCreate, n.solver_create);
    take(1, a->SolverSetStream, n.solver_stream);
    take(1, a->SpotrfBufferSize, n.potrf_size);
    take(1, a->Spotrf, n.potrf);
    take(1, a->Spotrs, n.potrs);
  }, out);
}

}  // namespace quant
}  // namespace qlink
