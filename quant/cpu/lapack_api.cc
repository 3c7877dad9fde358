#include "quant/cpu/lapack_api.h"

#include "backends/vendor_library.h"

namespace qlink {
namespace quant {

Status LoadLapack(const std::string& library, const LapackApi** out) {
  const std::string file = library.empty() ? "liblapack.so.3" : library;
  return LoadVendorLibraries({{file, "LAPACK", "solver_library"}}, LapackApi{}, [](VendorSymbols& take, LapackApi* a) {
    take(0, a->sgemm, "sgemm_");
    take(0, a->ssyrk, "ssyrk_");
    take(0, a->spotrf, "spotrf_");
    take(0, a->spotri, "spotri_");
    // The CPU backend's parallelism is its virtual devices, one host thread each: BLAS
    // threads of its own under every one of them oversubscribe the cores (OpenBLAS then
    // spins: a 4-device solve ran 17x slower than a serial one).
    using SetThreads = void(int);
    if (void* set = take.Find(0, "openblas_set_num_threads")) reinterpret_cast<SetThreads*>(set)(1);
  }, out);
}

}  // namespace quant
}  // namespace qlink
