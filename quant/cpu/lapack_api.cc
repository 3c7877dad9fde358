#include "quant/cpu/lapack_api.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

#include <boost/dll/shared_library.hpp>

namespace qlink {
namespace quant {

Status LoadLapack(const std::string& requested, const LapackApi** out) {
  struct Loaded {
    boost::dll::shared_library lib;
    LapackApi api;
  };
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  const std::string library = requested.empty() ? "liblapack.so.3" : requested;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[library];
  if (!slot) {
    auto loaded = std::make_unique<Loaded>();
    boost::dll::fs::error_code ec;
    loaded->lib.load(library, boost::dll::load_mode::search_system_folders | boost::dll::load_mode::rtld_now, ec);
    if (ec) {
      cache.erase(library);
      return Unavailable("quant: LAPACK library '" + library + "' cannot be loaded: " + ec.message() +
                         " (install liblapack3 or libopenblas0, or set config field 'solver_library')");
    }
    // dlsym through the handle also searches the library's dependencies (libblas.so.3
    // for reference LAPACK), which boost's has() does not.
    void* handle = loaded->lib.native();
    const char* missing = nullptr;
    auto resolve = [&](auto*& fn, const char* name) {
      void* sym = dlsym(handle, name);
      if (sym == nullptr && missing == nullptr) missing = name;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
    };
    LapackApi& a = loaded->api;
    resolve(a.sgemm, "sgemm_");
    resolve(a.ssyrk, "ssyrk_");
    resolve(a.spotrf, "spotrf_");
    resolve(a.spotri, "spotri_");
    if (missing != nullptr) {
      cache.erase(library);
      return Unavailable("quant: LAPACK library '" + library + "' lacks " + missing);
    }
    // The CPU backend's parallelism is its virtual devices, one host thread each: BLAS
    // threads of its own under every one of them oversubscribe the cores (OpenBLAS then
    // spins: a 4-device solve ran 17x slower than a serial one).
    using SetThreads = void(int);
    if (void* set = dlsym(handle, "openblas_set_num_threads")) reinterpret_cast<SetThreads*>(set)(1);
    slot = std::move(loaded);
  }
  *out = &slot->api;
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
