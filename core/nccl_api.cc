#include "core/nccl_api.h"

#include <map>
#include <mutex>
#include <type_traits>

namespace qlink {

Status NcclApi::Check(Result r, const char* what) const {
  if (r == 0) return Status::Ok();
  return RuntimeError(std::string("nccl: ") + what + " failed: " + GetErrorString(r) + " (" + std::to_string(r) + ")");
}

Status LoadNccl(const std::string& library, const NcclApi** out) {
  struct Loaded {
    boost::dll::shared_library lib;
    NcclApi api;
  };
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[library];
  if (!slot) {
    auto loaded = std::make_unique<Loaded>();
    boost::dll::fs::error_code ec;
    loaded->lib.load(library, boost::dll::load_mode::search_system_folders | boost::dll::load_mode::rtld_now, ec);
    if (ec) {
      cache.erase(library);
      return Unavailable("NCCL library '" + library + "' cannot be loaded: " + ec.message() +
                         " (set config field 'nccl_library' to its path)");
    }
    const char* missing = nullptr;
    auto resolve = [&](auto& fn, const char* name) {
      if (!loaded->lib.has(name)) {
        if (missing == nullptr) missing = name;
        return;
      }
      fn = &loaded->lib.get<std::remove_pointer_t<std::remove_reference_t<decltype(fn)>>>(name);
    };
    NcclApi& a = loaded->api;
    resolve(a.GetUniqueId, "ncclGetUniqueId");
    resolve(a.CommInitRank, "ncclCommInitRank");
    resolve(a.CommDestroy, "ncclCommDestroy");
    resolve(a.AllReduce, "ncclAllReduce");
    resolve(a.Broadcast, "ncclBroadcast");
    resolve(a.Reduce, "ncclReduce");
    resolve(a.ReduceScatter, "ncclReduceScatter");
    resolve(a.AllGather, "ncclAllGather");
    resolve(a.GetErrorString, "ncclGetErrorString");
    if (missing != nullptr) {
      cache.erase(library);
      return Unavailable("NCCL library '" + library + "' lacks " + missing);
    }
    slot = std::move(loaded);
  }
  *out = &slot->api;
  return Status::Ok();
}

}  // namespace qlink
