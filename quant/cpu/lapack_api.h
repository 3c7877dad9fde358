// The BLAS and LAPACK routines the CPU backend's GPTQ engine calls, resolved at run time
// from the reference Fortran interface every implementation exports (OpenBLAS, reference
// LAPACK, MKL, BLIS): qlink builds and loads without them. The engine is what a machine
// without a GPU quantizes with, so by default it loads OpenBLAS by name, not whatever
// liblapack.so.3 the system's alternatives point at (Debian's default is the reference
// implementation, many times slower).
#pragma once

#include <cstddef>
#include <string>

#include "backends/status.h"
#include "quant/quant_math.h"

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
  using Strtri = void(const char* uplo, const char* diag, const int* n, float* a, const int* lda, int* info, size_t,
                      size_t);

  using GetThreads = int();
  using SetThreads = void(int);

  Sgemm* sgemm = nullptr;  // from the BLAS library
  Ssyrk* ssyrk = nullptr;
  Spotrf* spotrf = nullptr;  // from the LAPACK library
  Spotri* spotri = nullptr;
  Strtri* strtri = nullptr;
  GetThreads* get_threads = nullptr;  // OpenBLAS's thread count, where the BLAS is OpenBLAS
  SetThreads* set_threads = nullptr;
  std::string implementation;          // "OpenBLAS (config)", "MKL", "BLIS", or "" (not recognized)
  std::string blas_file, lapack_file;  // where sgemm_ and spotrf_ came from, symlinks resolved
};

// The BLAS on one thread while any engine call is inside it, the process's own setting
// restored when the last one leaves. The CPU backend's parallelism is its virtual devices,
// one host thread each: BLAS threads of its own under every one of them oversubscribe the
// cores (OpenBLAS then spins: a 4-device solve ran 17x slower than a serial one). The
// setting is the process's (on Debian PyTorch calls the same OpenBLAS), so it is not left
// changed: the host's own BLAS work keeps its threads outside qlink's calls. A no-op where
// the library has no thread setting.
class SerialBlas {
 public:
  explicit SerialBlas(const LapackApi& api);
  ~SerialBlas();
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;

 private:
  const LapackApi& api_;
};

// The optimized library loaded when neither config field names one.
constexpr const char* kDefaultCpuLinalg = "libopenblas.so.0";
// What the engine falls back to without it, with a warning: the system's LAPACK, whose
// BLAS dependency supplies sgemm_ and ssyrk_.
constexpr const char* kFallbackCpuLinalg = "liblapack.so.3";

// Loads the BLAS (libraries.blas; "" = the LAPACK library's own) and LAPACK
// (libraries.solver; "" = kDefaultCpuLinalg, else kFallbackCpuLinalg) once per process
// for each choice; the API stays valid for the life of the process. *report says what was
// loaded, with a warning when it is not a known optimized library or a fallback.
Status LoadLapack(const Libraries& libraries, const LapackApi** out, LibraryReport* report);

}  // namespace quant
}  // namespace qlink
