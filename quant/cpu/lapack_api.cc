#include "quant/cpu/lapack_api.h"

#include <mutex>

#include "backends/vendor_library.h"

namespace qlink {
namespace quant {
namespace {

// Which implementation the BLAS library is, from the symbols only it exports; "" when
// none of the optimized ones (the reference BLAS, or one qlink does not know).
std::string Implementation(const VendorSymbols& take) {
  using Text = const char*();
  if (void* config = take.Find(1, "openblas_get_config")) {
    return std::string("OpenBLAS (") + reinterpret_cast<Text*>(config)() + ")";
  }
  if (take.Find(1, "mkl_get_version_string") != nullptr) return "MKL";
  if (take.Find(1, "bli_info_get_version_str") != nullptr) return "BLIS";
  return "";
}

Status Load(const std::string& blas, const std::string& solver, const LapackApi** out) {
  return LoadVendorLibraries(
      {{solver, "LAPACK", "solver_library"}, {blas, "BLAS", "blas_library"}}, LapackApi{},
      [](VendorSymbols& take, LapackApi* a) {
        take(1, a->sgemm, "sgemm_");
        take(1, a->ssyrk, "ssyrk_");
        take(0, a->spotrf, "spotrf_");
        take(0, a->spotri, "spotri_");
        take(0, a->strtri, "strtri_");
        a->get_threads = reinterpret_cast<LapackApi::GetThreads*>(take.Find(1, "openblas_get_num_threads"));
        a->set_threads = reinterpret_cast<LapackApi::SetThreads*>(take.Find(1, "openblas_set_num_threads"));
        if (a->get_threads == nullptr) a->set_threads = nullptr;  // nothing to restore
        a->implementation = Implementation(take);
        a->blas_file = DefiningFile(reinterpret_cast<void*>(a->sgemm));
        a->lapack_file = DefiningFile(reinterpret_cast<void*>(a->spotrf));
      },
      out);
}

std::mutex serial_mu;
int serial_calls = 0;     // engine calls inside the BLAS now
int process_threads = 0;  // the setting they found, restored by the last to leave

}  // namespace

SerialBlas::SerialBlas(const LapackApi& api) : api_(api) {
  if (api_.set_threads == nullptr) return;
  std::lock_guard<std::mutex> lock(serial_mu);
  if (serial_calls++ == 0) {
    process_threads = api_.get_threads();
    if (process_threads != 1) api_.set_threads(1);
  }
}

SerialBlas::~SerialBlas() {
  if (api_.set_threads == nullptr) return;
  std::lock_guard<std::mutex> lock(serial_mu);
  if (--serial_calls == 0 && process_threads != 1) api_.set_threads(process_threads);
}

Status LoadLapack(const Libraries& libraries, const LapackApi** out, LibraryReport* report) {
  std::string fallback;  // why the default was not loaded, when it was not
  if (!libraries.solver.empty() || !libraries.blas.empty()) {
    const std::string solver = libraries.solver.empty() ? kDefaultCpuLinalg : libraries.solver;
    QLINK_RETURN_IF_ERROR(Load(libraries.blas.empty() ? solver : libraries.blas, solver, out));
  } else if (Status s = Load(kDefaultCpuLinalg, kDefaultCpuLinalg, out); !s.ok()) {
    fallback = s.message();
    QLINK_RETURN_IF_ERROR(Load(kFallbackCpuLinalg, kFallbackCpuLinalg, out));
  }
  const LapackApi& a = **out;
  report->loaded = (a.implementation.empty() ? std::string("an unrecognized BLAS") : a.implementation) + " (BLAS " +
                   a.blas_file + ", LAPACK " + a.lapack_file + ")";
  report->warning.clear();
  if (!fallback.empty()) report->warning = fallback + "; ";
  if (!fallback.empty() || a.implementation.empty()) {
    report->warning +=
        "the CPU GPTQ engine runs on " + report->loaded +
        (a.implementation.empty() ? ", likely the reference BLAS: many times slower than OpenBLAS" : "") +
        " (install libopenblas0-pthread, or name the libraries in config fields blas_library / "
        "solver_library)";
  }
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
