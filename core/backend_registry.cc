#include "core/backend_registry.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <boost/dll/runtime_symbol_info.hpp>

namespace qlink {
namespace {

boost::dll::fs::path BundledBackendPath(const std::string& name) {
  return boost::dll::this_line_location().parent_path() / ("libqlink_backend_" + name + ".so");
}

// Backend libraries stay loaded for the life of the process once opened: GPU runtimes
// (the static CUDA runtime, libamdhip64) keep global state that does not survive being
// unmapped, and reloading them for every context would leak it each time.
Status Open(const boost::dll::fs::path& path, std::shared_ptr<boost::dll::shared_library>* out) {
  static std::mutex mu;
  // Never destroyed: no library is unmapped at exit either, under runtimes still tearing down.
  static auto* opened = new std::map<std::string, std::shared_ptr<boost::dll::shared_library>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*opened)[path.string()];
  if (!slot) {
    boost::dll::fs::error_code ec;
    auto library = std::make_shared<boost::dll::shared_library>(
        path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
    if (ec) {
      opened->erase(path.string());
      return Unavailable("backend library '" + path.string() + "' cannot be loaded: " + ec.message());
    }
    slot = std::move(library);
  }
  *out = slot;
  return Status::Ok();
}

// A backend meets core through a C++ vtable, so only a library built with this core's
// interface version is called at all; anything else is refused from its exports alone.
Status CheckInterfaceVersion(const boost::dll::shared_library& library, const std::string& path) {
  const std::string ours = std::to_string(QLINK_BACKEND_INTERFACE_VERSION);
  if (!library.has(QLINK_BACKEND_VERSION_SYMBOL)) {
    return Unavailable("backend library '" + path +
                       "' does not export " QLINK_BACKEND_VERSION_SYMBOL
                       ": it predates versioned backend interfaces; this libqlink.so needs backend interface "
                       "version " +
                       ours + " (rebuild the backend with this qlink)");
  }
  const uint32_t theirs = library.get<qlink_backend_version_fn>(QLINK_BACKEND_VERSION_SYMBOL)();
  if (theirs != QLINK_BACKEND_INTERFACE_VERSION) {
    return Unavailable("backend library '" + path + "' implements backend interface version " + std::to_string(theirs) +
                       ", this libqlink.so needs version " + ours + " (rebuild the backend with this qlink)");
  }
  if (!library.has(QLINK_BACKEND_CREATE_SYMBOL)) {
    return Unavailable("backend library '" + path + "' does not export " QLINK_BACKEND_CREATE_SYMBOL);
  }
  return Status::Ok();
}

Status LoadFrom(const boost::dll::fs::path& path, const Config& config, LoadedBackend* out) {
  std::shared_ptr<boost::dll::shared_library> library;
  QLINK_RETURN_IF_ERROR(Open(path, &library));
  QLINK_RETURN_IF_ERROR(CheckInterfaceVersion(*library, path.string()));
  qlink_backend_options options{};
  options.struct_size = sizeof(options);
  options.virtual_devices = config.cpu_devices;
  options.options_json = config.backend_options.c_str();
  options.blas_library = config.blas_library.c_str();
  options.solver_library = config.solver_library.c_str();
  char error[1024] = "";
  DeviceBackend* backend =
      library->get<qlink_backend_create_fn>(QLINK_BACKEND_CREATE_SYMBOL)(&options, error, sizeof(error));
  if (backend == nullptr) return Unavailable("backend library '" + path.string() + "' refused to start: " + error);
  out->backend.reset(backend);
  out->library = std::move(library);
  return Status::Ok();
}

Status LoadNamed(const std::string& name, const Config& config, LoadedBackend* out) {
  if (name == "cpu" || name == "cuda" || name == "hip") return LoadFrom(BundledBackendPath(name), config, out);
  return LoadFrom(boost::dll::fs::path(name), config, out);
}

}  // namespace

Status LoadBackend(const Config& config, spdlog::logger& log, LoadedBackend* out) {
  if (config.backend != "auto") {
    QLINK_RETURN_IF_ERROR(LoadNamed(config.backend, config, out));
    log.debug("backend '{}' loaded with {} device(s)", out->backend->name(), out->backend->device_count());
    return Status::Ok();
  }
  std::string skipped;
  for (const char* vendor : {"cuda", "hip"}) {
    LoadedBackend candidate;
    Status s = LoadNamed(vendor, config, &candidate);
    if (s.ok() && candidate.backend->device_count() > 0) {
      *out = std::move(candidate);
      break;
    }
    skipped +=
        std::string(skipped.empty() ? "" : "; ") + vendor + ": " + (s.ok() ? std::string("no devices") : s.message());
  }
  if (!out->backend) QLINK_RETURN_IF_ERROR(LoadNamed("cpu", config, out));
  static std::once_flag logged;
  std::call_once(logged, [&] {
    log.info("backend auto: chose '{}' with {} device(s){}", out->backend->name(), out->backend->device_count(),
             skipped.empty() ? "" : " (skipped " + skipped + ")");
  });
  return Status::Ok();
}

}  // namespace qlink
