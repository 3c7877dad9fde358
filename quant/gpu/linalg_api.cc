#include "quant/gpu/linalg_api.h"

#include <vector>

#include "backends/vendor_library.h"

#if defined(QLINK_GPU_CUDA)
#include <cublas_api.h>
#include <cusolver_common.h>
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
// hipBLAS 2's GemmEx_v2 takes them; HIPSOLVER_DIAG_NON_UNIT.
constexpr LinalgApi kEnums{111, 112, 122, 121, 0, 0, 0, 2, 14, 2, 160, 131};
constexpr LinalgNames kNames{"hipblasCreate",
                             "hipblasDestroy",
                             "hipblasSetStream",
                             nullptr,
                             "hipblasSgemm",
                             "hipblasGemmEx_v2",
                             "hipblasSsyrk",
                             "hipsolverDnCreate",
                             "hipsolverDnDestroy",
                             "hipsolverDnSetStream",
                             "hipsolverDnSpotrf_bufferSize",
                             "hipsolverDnSpotrf",
                             "hipsolverDnSpotrs",
                             "hipblasSetWorkspace",
                             "hipsolverDnXtrtri_bufferSize",
                             "hipsolverDnXtrtri"};
// hipblasStatus_t and hipsolverStatus_t as hipBLAS 2 and hipSOLVER 2 number them (typed from
// their headers, which Debian 12 does not package: not checked at compile time as CUDA's are).
constexpr const char* kBlasStatus[] = {
    "HIPBLAS_STATUS_SUCCESS",           "HIPBLAS_STATUS_NOT_INITIALIZED", "HIPBLAS_STATUS_ALLOC_FAILED",
    "HIPBLAS_STATUS_INVALID_VALUE",     "HIPBLAS_STATUS_MAPPING_ERROR",   "HIPBLAS_STATUS_EXECUTION_FAILED",
    "HIPBLAS_STATUS_INTERNAL_ERROR",    "HIPBLAS_STATUS_NOT_SUPPORTED",   "HIPBLAS_STATUS_ARCH_MISMATCH",
    "HIPBLAS_STATUS_HANDLE_IS_NULLPTR", "HIPBLAS_STATUS_INVALID_ENUM",    "HIPBLAS_STATUS_UNKNOWN"};
constexpr const char* kSolverStatus[] = {
    "HIPSOLVER_STATUS_SUCCESS",           "HIPSOLVER_STATUS_NOT_INITIALIZED", "HIPSOLVER_STATUS_ALLOC_FAILED",
    "HIPSOLVER_STATUS_INVALID_VALUE",     "HIPSOLVER_STATUS_MAPPING_ERROR",   "HIPSOLVER_STATUS_EXECUTION_FAILED",
    "HIPSOLVER_STATUS_INTERNAL_ERROR",    "HIPSOLVER_STATUS_NOT_SUPPORTED",   "HIPSOLVER_STATUS_ARCH_MISMATCH",
    "HIPSOLVER_STATUS_HANDLE_IS_NULLPTR", "HIPSOLVER_STATUS_INVALID_ENUM",    "HIPSOLVER_STATUS_UNKNOWN",
    "HIPSOLVER_STATUS_ZERO_PIVOT"};
#else
constexpr const char* kVendor = "cuda";
constexpr const char* kBlas = "libcublas.so.13";
constexpr const char* kSolver = "libcusolver.so.12";
constexpr LinalgApi kEnums{CUBLAS_OP_N,
                           CUBLAS_OP_T,
                           CUBLAS_FILL_MODE_LOWER,
                           CUBLAS_FILL_MODE_UPPER,
                           CUBLAS_DEFAULT_MATH,
                           CUBLAS_TF32_TENSOR_OP_MATH,
                           CUDA_R_32F,
                           CUDA_R_16F,
                           CUDA_R_16BF,
                           CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT,
                           CUBLAS_DIAG_NON_UNIT};
constexpr LinalgNames kNames{"cublasCreate_v2",
                             "cublasDestroy_v2",
                             "cublasSetStream_v2",
                             "cublasSetMathMode",
                             "cublasSgemm_v2",
                             "cublasGemmEx",
                             "cublasSsyrk_v2",
                             "cusolverDnCreate",
                             "cusolverDnDestroy",
                             "cusolverDnSetStream",
                             "cusolverDnSpotrf_bufferSize",
                             "cusolverDnSpotrf",
                             "cusolverDnSpotrs",
                             "cublasSetWorkspace_v2",
                             "cusolverDnXtrtri_bufferSize",
                             "cusolverDnXtrtri"};
// cublasStatus_t and cusolverStatus_t by value (the gaps are values they do not use), checked
// against the headers below.
constexpr const char* kBlasStatus[] = {"CUBLAS_STATUS_SUCCESS",
                                       "CUBLAS_STATUS_NOT_INITIALIZED",
                                       nullptr,
                                       "CUBLAS_STATUS_ALLOC_FAILED",
                                       nullptr,
                                       nullptr,
                                       nullptr,
                                       "CUBLAS_STATUS_INVALID_VALUE",
                                       "CUBLAS_STATUS_ARCH_MISMATCH",
                                       nullptr,
                                       nullptr,
                                       "CUBLAS_STATUS_MAPPING_ERROR",
                                       nullptr,
                                       "CUBLAS_STATUS_EXECUTION_FAILED",
                                       "CUBLAS_STATUS_INTERNAL_ERROR",
                                       "CUBLAS_STATUS_NOT_SUPPORTED",
                                       "CUBLAS_STATUS_LICENSE_ERROR"};
static_assert(CUBLAS_STATUS_NOT_INITIALIZED == 1 && CUBLAS_STATUS_ALLOC_FAILED == 3 &&
                  CUBLAS_STATUS_INVALID_VALUE == 7 && CUBLAS_STATUS_ARCH_MISMATCH == 8 &&
                  CUBLAS_STATUS_MAPPING_ERROR == 11 && CUBLAS_STATUS_EXECUTION_FAILED == 13 &&
                  CUBLAS_STATUS_INTERNAL_ERROR == 14 && CUBLAS_STATUS_NOT_SUPPORTED == 15 &&
                  CUBLAS_STATUS_LICENSE_ERROR == 16,
              "kBlasStatus follows cublasStatus_t");
constexpr const char* kSolverStatus[] = {
    "CUSOLVER_STATUS_SUCCESS",          "CUSOLVER_STATUS_NOT_INITIALIZED", "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_INVALID_VALUE",    "CUSOLVER_STATUS_ARCH_MISMATCH",   "CUSOLVER_STATUS_MAPPING_ERROR",
    "CUSOLVER_STATUS_EXECUTION_FAILED", "CUSOLVER_STATUS_INTERNAL_ERROR",  "CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED",
    "CUSOLVER_STATUS_NOT_SUPPORTED",    "CUSOLVER_STATUS_ZERO_PIVOT",      "CUSOLVER_STATUS_INVALID_LICENSE"};
static_assert(CUSOLVER_STATUS_NOT_INITIALIZED == 1 && CUSOLVER_STATUS_ALLOC_FAILED == 2 &&
                  CUSOLVER_STATUS_INVALID_VALUE == 3 && CUSOLVER_STATUS_ARCH_MISMATCH == 4 &&
                  CUSOLVER_STATUS_MAPPING_ERROR == 5 && CUSOLVER_STATUS_EXECUTION_FAILED == 6 &&
                  CUSOLVER_STATUS_INTERNAL_ERROR == 7 && CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED == 8 &&
                  CUSOLVER_STATUS_NOT_SUPPORTED == 9 && CUSOLVER_STATUS_ZERO_PIVOT == 10 &&
                  CUSOLVER_STATUS_INVALID_LICENSE == 11,
              "kSolverStatus follows cusolverStatus_t");
#endif

template <size_t N>
const char* StatusName(const char* const (&names)[N], int result) {
  return result >= 0 && static_cast<size_t>(result) < N && names[result] != nullptr ? names[result] : "unknown status";
}

}  // namespace

const char* BlasStatusName(int result) { return StatusName(kBlasStatus, result); }
const char* SolverStatusName(int result) { return StatusName(kSolverStatus, result); }

Status LoadLinalg(const std::string& blas, const std::string& solver, const LinalgApi** out) {
  const std::string what = std::string(kVendor) + " GPTQ engine's";
  const std::vector<VendorLibrary> libraries = {
      {blas.empty() ? kBlas : blas, what + " BLAS", "blas_library"},
      {solver.empty() ? kSolver : solver, what + " solver", "solver_library"}};
  return LoadVendorLibraries(
      libraries, kEnums,
      [](VendorSymbols& take, LinalgApi* a) {
        const LinalgNames& n = kNames;
        a->names = n;
        take(0, a->BlasCreate, n.blas_create);
        take(0, a->BlasDestroy, n.blas_destroy);
        take(0, a->BlasSetStream, n.blas_stream);
        take(0, a->BlasSetMathMode, n.math);
        a->BlasSetWorkspace = reinterpret_cast<decltype(a->BlasSetWorkspace)>(take.Find(0, n.blas_workspace));
        take(0, a->Sgemm, n.sgemm);
        // Optional: without it (a hipBLAS before GemmEx_v2) the Hessian keeps the IEEE path.
        a->GemmEx = reinterpret_cast<decltype(a->GemmEx)>(take.Find(0, n.gemm_ex));
        take(0, a->Ssyrk, n.ssyrk);
        take(1, a->SolverCreate, n.solver_create);
        take(1, a->SolverDestroy, n.solver_destroy);
        take(1, a->SolverSetStream, n.solver_stream);
        take(1, a->SpotrfBufferSize, n.potrf_size);
        take(1, a->Spotrf, n.potrf);
        take(1, a->Spotrs, n.potrs);
        a->XtrtriBufferSize = reinterpret_cast<decltype(a->XtrtriBufferSize)>(take.Find(1, n.trtri_size));
        a->Xtrtri = reinterpret_cast<decltype(a->Xtrtri)>(take.Find(1, n.trtri));
        if (a->XtrtriBufferSize == nullptr) a->Xtrtri = nullptr;  // both or neither
      },
      out);
}

}  // namespace quant
}  // namespace qlink
