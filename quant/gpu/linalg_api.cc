#include "quant/gpu/linalg_api.h"

#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include <boost/dll/shared_library.hpp>

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
// hipblasOperation_t, hipblasFillMode_t (hipsolverFillMode_t has the same values).
constexpr LinalgApi kEnums{111, 112, 122, 121, 0, 0};
struct Names {
  const char *blas_create = "hipblasCreate", *blas_stream = "hipblasSetStream", *math = nullptr,
             *sgemm = "hipblasSgemm", *ssyrk = "hipblasSsyrk", *solver_create = "hipsolverDnCreate",
             *solver_stream = "hipsolverDnSetStream", *potrf_size = "hipsolverDnSpotrf_bufferSize",
             *potrf = "hipsolverDnSpotrf", *potrs = "hipsolverDnSpotrs";
};
#else
constexpr const char* kVendor = "cuda";
constexpr const char* kBlas = "libcublas.so.13";
constexpr const char* kSolver = "libcusolver.so.12";
constexpr LinalgApi kEnums{CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_FILL_MODE_LOWER, CUBLAS_FILL_MODE_UPPER,
                           CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH};
struct Names {
  const char *blas_create = "cublasCreate_v2", *blas_stream = "cublasSetStream_v2", *math = "cublasSetMathMode",
             *sgemm = "cublasSgemm_v2", *ssyrk = "cublasSsyrk_v2", *solver_create = "cusolverDnCreate",
             *solver_stream = "cusolverDnSetStream", *potrf_size = "cusolverDnSpotrf_bufferSize",
             *potrf = "cusolverDnSpotrf", *potrs = "cusolverDnSpotrs";
};
#endif

Status Open(const std::string& name, const char* what, boost::dll::shared_library* lib) {
  boost::dll::fs::error_code ec;
  lib->load(name, boost::dll::load_mode::search_system_folders | boost::dll::load_mode::rtld_now, ec);
  if (ec) {
    return Unavailable(std::string(kVendor) + ": the GPTQ engine's " + what + " library '" + name +
                       "' cannot be loaded: " + ec.message() + " (set config field '" + what + "_library' to its path)");
  }
  return Status::Ok();
}

}  // namespace

Status LoadLinalg(const std::string& blas_name, const std::string& solver_name, const LinalgApi** out) {
  struct Loaded {
    boost::dll::shared_library blas, solver;
    LinalgApi api = kEnums;
  };
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::unique_ptr<Loaded>> cache;
  const std::string blas = blas_name.empty() ? kBlas : blas_name;
  const std::string solver = solver_name.empty() ? kSolver : solver_name;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{blas, solver}];
  if (!slot) {
    auto loaded = std::make_unique<Loaded>();
    Status s = Open(blas, "blas", &loaded->blas);
    if (s.ok()) s = Open(solver, "solver", &loaded->solver);
    const char* missing = nullptr;
    const std::string* missing_from = nullptr;
    auto resolve = [&](boost::dll::shared_library& lib, const std::string& from, auto& fn, const char* name) {
      if (name == nullptr) return;
      if (!lib.has(name)) {
        if (missing == nullptr) missing = name, missing_from = &from;
        return;
      }
      fn = &lib.get<std::remove_pointer_t<std::remove_reference_t<decltype(fn)>>>(name);
    };
    if (s.ok()) {
      const Names n;
      LinalgApi& a = loaded->api;
      resolve(loaded->blas, blas, a.BlasCreate, n.blas_create);
      resolve(loaded->blas, blas, a.BlasSetStream, n.blas_stream);
      resolve(loaded->blas, blas, a.BlasSetMathMode, n.math);
      resolve(loaded->blas, blas, a.Sgemm, n.sgemm);
      resolve(loaded->blas, blas, a.Ssyrk, n.ssyrk);
      resolve(loaded->solver, solver, a.SolverCreate, n.solver_create);
      resolve(loaded->solver, solver, a.SolverSetStream, n.solver_stream);
      resolve(loaded->solver, solver, a.SpotrfBufferSize, n.potrf_size);
      resolve(loaded->solver, solver, a.Spotrf, n.potrf);
      resolve(loaded->solver, solver, a.Spotrs, n.potrs);
      if (missing != nullptr) s = Unavailable(std::string(kVendor) + ": '" + *missing_from + "' lacks " + missing);
    }
    if (!s.ok()) {
      cache.erase({blas, solver});
      return s;
    }
    slot = std::move(loaded);
  }
  *out = &slot->api;
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
