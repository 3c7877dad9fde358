// The BLAS and solver routines the GPU engine calls, resolved at run time from the vendor's
// libraries (cuBLAS + cuSOLVER for CUDA, hipBLAS + hipSOLVER for HIP, which mirror them
// name for name): the backend builds and loads without them, and the GPTQ entry points say
// which one is missing. Declared here, not taken from the vendors' headers, so one source
// serves both vendors (the CUDA build checks the constants against cuBLAS's headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/status.h"

namespace qlink {
namespace quant {

// The vendor's names of the functions below, for loading them and for error messages.
struct LinalgNames {
  const char *blas_create, *blas_destroy, *blas_stream, *math, *sgemm, *gemm_ex, *ssyrk, *solver_create,
      *solver_destroy, *solver_stream, *potrf_size, *potrf, *potrs, *blas_workspace, *trtri_size, *trtri;
};

struct LinalgApi {
  using Handle = void*;
  using Result = int;  // cublasStatus_t / cusolverStatus_t; 0 is success

  // The vendor's values of the few enumerators used.
  int op_n, op_t;
  int fill_lower, fill_upper;
  int math_default, math_tf32;
  int r_32f, r_16f, r_16bf;  // cudaDataType / hipDataType
  int compute_32f;           // cublasComputeType_t / hipblasComputeType_t
  int gemm_default;          // cublasGemmAlgo_t / hipblasGemmAlgo_t
  int diag_non_unit;         // cublasDiagType_t / hipsolverDiagType_t

  Result (*BlasCreate)(Handle*);
  Result (*BlasDestroy)(Handle);
  Result (*BlasSetStream)(Handle, void* stream);
  Result (*BlasSetMathMode)(Handle, int mode);  // NULL where the vendor has none
  // The handle's workspace from now on (SetStream resets it to the library's default pool);
  // NULL where the vendor has none.
  Result (*BlasSetWorkspace)(Handle, void* workspace, size_t bytes);
  Result (*Sgemm)(Handle, int transa, int transb, int m, int n, int k, const float* alpha, const float* a, int lda,
                  const float* b, int ldb, const float* beta, float* c, int ldc);
  // c = alpha op(a) op(b) + beta c, each matrix of its own data type, summed as compute_type;
  // NULL where the library lacks it.
  Result (*GemmEx)(Handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a, int a_type,
                   int lda, const void* b, int b_type, int ldb, const void* beta, void* c, int c_type, int ldc,
                   int compute_type, int algo);
  Result (*Ssyrk)(Handle, int uplo, int trans, int n, int k, const float* alpha, const float* a, int lda,
                  const float* beta, float* c, int ldc);

  Result (*SolverCreate)(Handle*);
  Result (*SolverDestroy)(Handle);
  Result (*SolverSetStream)(Handle, void* stream);
  Result (*SpotrfBufferSize)(Handle, int uplo, int n, float* a, int lda, int* lwork);
  Result (*Spotrf)(Handle, int uplo, int n, float* a, int lda, float* work, int lwork, int* info);
  Result (*Spotrs)(Handle, int uplo, int n, int nrhs, const float* a, int lda, float* b, int ldb, int* info);
  // The 64-bit generic trtri and its workspace sizes; NULL where the library lacks them
  // (then only the triangular inverse is refused).
  Result (*XtrtriBufferSize)(Handle, int uplo, int diag, int64_t n, int data_type, void* a, int64_t lda,
                             size_t* device_bytes, size_t* host_bytes);
  Result (*Xtrtri)(Handle, int uplo, int diag, int64_t n, int data_type, void* a, int64_t lda, void* device_work,
                   size_t device_bytes, void* host_work, size_t host_bytes, int* info);

  LinalgNames names;
};

// The vendor's name of a BLAS or solver result ("CUBLAS_STATUS_INVALID_VALUE",
// "HIPSOLVER_STATUS_INTERNAL_ERROR"), "unknown status" for a value it does not list.
const char* BlasStatusName(int result);
const char* SolverStatusName(int result);

// Loads the vendor's BLAS library `blas` and solver library `solver` ("" = the defaults:
// libcublas.so.13 and libcusolver.so.12, or libhipblas.so.2 and libhipsolver.so.0) once per
// process; the API stays valid for the life of the process.
Status LoadLinalg(const std::string& blas, const std::string& solver, const LinalgApi** out);

}  // namespace quant
}  // namespace qlink
