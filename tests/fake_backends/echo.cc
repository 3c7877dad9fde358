// A backend of the current interface that refuses to start, with every option it was
// handed in its reason: what core passed, as the backend saw it.
#include <memory>
#include <string>

#include "backends/device_backend.h"

namespace {

qlink::Status Echo(const qlink_backend_options& o, std::unique_ptr<qlink::DeviceBackend>*) {
  return qlink::Unavailable("echo: virtual_devices " + std::to_string(o.virtual_devices) + ", options_json " +
                            o.options_json + ", blas_library '" + o.blas_library + "', solver_library '" +
                            o.solver_library + "'");
}

}  // namespace

QLINK_EXPORT_BACKEND(Echo)
