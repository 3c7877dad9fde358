// The BLAS and LAPACK routines the CPU backend's GPTQ engine calls, resolved at run time
// from the reference Fortran interface every implementation exports (OpenBLAS, reference
// LAPACK, MKL): qlink builds and loads without them, and takes whichever the machine has.
#pragma once

#include <cstddef>
#include <string>

#include "backends/status.h"

namespace qlink {
namespace quant {

struct LapackApi {
  // Fortran calling convention: every argument by address, then one hidden length per
  // character argument.
  using Sgemm = void(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                     const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                     const float* beta, float* c, const int* ldc, size_t, size_t);
  using Ssyrk = void(const char* uplo, const char* trans, const int* n, const int* k, const float* alpha,
                     const float* a, const int* lda, const float* beta, float* c, const int* ldc, size_t, size_t);
  using Spotrf = void(const char* uplo, const int* n, float* a, const int* lda, int* info, size_t);
  using Spotri = void(const char* uplo, const int* n, float* a, const int* lda, int* info, size_t);

  Sgemm* sgemm = nullptr;
  Ssyrk* ssyrk = nullptr;
  Spotrf* spotrf = nullptr;
  Spotri* spotri = nullptr;
};

// Loads `library` ("" = liblapack.so.3, whose BLAS dependency supplies sgemm_ and ssyrk_)
// once per process; the API stays valid for the life of the process.
Status LoadLapack(const std::string& library, const LapackApi** out);

}  // namespace quant
}  // namespace qlink
