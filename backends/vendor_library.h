// What qlink calls in libraries it does not link (NCCL or RCCL; BLAS and LAPACK; cuBLAS and
// cuSOLVER or their HIP twins): opened by name on first use and kept, with the table of the
// functions taken from them, until the process ends. A library that is missing fails only
// the calls that need it, with a message naming it and the config field that sets it.
#pragma once

#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/dll/shared_library.hpp>

#include "backends/status.h"

namespace qlink {

// The file that defines `symbol` as the dynamic linker resolved it, symlinks followed (a
// library's functions may live in one of its dependencies, and Debian's liblapack.so.3 is an
// alternative that may point at either of two implementations); "?" when unknown.
inline std::string DefiningFile(const void* symbol) {
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "?";
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

// One library to open: its file name or path, what it is in messages ("NCCL"), and the
// config field that names it.
struct VendorLibrary {
  std::string file;
  std::string what;
  std::string config_field;
};

// Takes functions from the opened libraries by name, noting the first it cannot find.
// Looked up through each library's handle, so a library's dependencies are searched too
// (reference LAPACK's BLAS functions live in libblas.so.3).
class VendorSymbols {
 public:
  VendorSymbols(const std::vector<VendorLibrary>& libraries, std::vector<boost::dll::shared_library>& opened)
      : libraries_(libraries), opened_(opened) {}

  // Sets fn to `name` from libraries[library]; a NULL name (a function this vendor lacks)
  // leaves fn NULL.
  template <typename Fn>
  void operator()(size_t library, Fn*& fn, const char* name) {
    if (name == nullptr) return;
    fn = reinterpret_cast<Fn*>(Find(library, name));
    if (fn == nullptr && missing_.empty()) {
      missing_ = libraries_[library].what + " library '" + libraries_[library].file + "' lacks " + name;
    }
  }
  // `name` from libraries[library], or NULL (not an error).
  void* Find(size_t library, const char* name) const { return dlsym(opened_[library].native(), name); }
  const std::string& missing() const { return missing_; }

 private:
  const std::vector<VendorLibrary>& libraries_;
  std::vector<boost::dll::shared_library>& opened_;
  std::string missing_;
};

// The Api that fill(symbols, &api) makes from `libraries`, opened once per process for
// each list of files; *out stays valid until the process ends. One cache per call site.
template <typename Api, typename Fill>
Status LoadVendorLibraries(const std::vector<VendorLibrary>& libraries, Api initial, Fill fill, const Api** out) {
  struct Loaded {
    std::vector<boost::dll::shared_library> opened;
    Api api;
  };
  static std::mutex mu;
  static std::map<std::vector<std::string>, std::unique_ptr<Loaded>> cache;
  std::vector<std::string> key;
  for (const VendorLibrary& l : libraries) key.push_back(l.file);
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Loaded>& slot = cache[key];
  if (!slot) {
    auto loaded = std::make_unique<Loaded>(Loaded{std::vector<boost::dll::shared_library>(libraries.size()), initial});
    for (size_t i = 0; i < libraries.size(); ++i) {
      const VendorLibrary& l = libraries[i];
      boost::dll::fs::error_code ec;
      loaded->opened[i].load(l.file, boost::dll::load_mode::search_system_folders | boost::dll::load_mode::rtld_now,
                             ec);
      if (ec) {
        cache.erase(key);
        return Unavailable(l.what + " library '" + l.file + "' cannot be loaded: " + ec.message() +
                           " (set config field '" + l.config_field + "' to its path)");
      }
    }
    VendorSymbols symbols(libraries, loaded->opened);
    fill(symbols, &loaded->api);
    if (!symbols.missing().empty()) {
      cache.erase(key);
      return Unavailable(symbols.missing());
    }
    slot = std::move(loaded);
  }
  *out = &slot->api;
  return Status::Ok();
}

}  // namespace qlink
