// Finds and loads the device backend a config asks for.
#pragma once

#include <memory>

#include <spdlog/logger.h>
#include <boost/dll/shared_library.hpp>

#include "backends/device_backend.h"
#include "core/config.h"

namespace qlink {

// A backend and the library its code lives in (kept loaded for the life of the process).
struct LoadedBackend {
  std::shared_ptr<boost::dll::shared_library> library;
  std::unique_ptr<DeviceBackend> backend;
};

// config.backend: "cpu", "cuda", "hip" load libqlink_backend_<name>.so from the folder
// libqlink.so was loaded from; any other value is a path to a backend library; "auto"
// takes the first of cuda, hip with devices, else cpu. An explicit backend that cannot
// load is UNAVAILABLE with the loader's reason.
Status LoadBackend(const Config& config, spdlog::logger& log, LoadedBackend* out);

}  // namespace qlink
