// A backend library built against the interface version before this build's (its
// SignRoundLayer, say, ending before the SignSGD step fields this core's backward passes):
// core must refuse it from the version alone, never calling its factory.
#include <cstdlib>

#include "backends/device_backend.h"

extern "C" uint32_t qlink_backend_interface_version() { return QLINK_BACKEND_INTERFACE_VERSION - 1; }
extern "C" void* qlink_backend_create(const void*, char*, size_t) { std::abort(); }
