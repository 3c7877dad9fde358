// The GPU backend's host code (gpu_backend.cc and the GPTQ engine's quant/gpu): runtime
// errors as a Status, and the device made current for the enqueue that follows.
#pragma once

#include <string>

#include "backends/gpu/gpu_runtime.h"
#include "backends/status.h"

namespace qlink {
namespace gpu {

// Turns a runtime error into a Status and drains the runtime's last error, so the host
// framework's next launch does not fail on our leftovers.
inline Status Check(gpuError_t e, const char* what) {
  if (e == gpuSuccess) return Status::Ok();
  (void)gpuGetLastError();
  std::string message =
      std::string(QLINK_GPU_BACKEND_NAME ": ") + what + ": " + gpuGetErrorName(e) + " (" + gpuGetErrorString(e) + ")";
  return e == gpuErrorMemoryAllocation ? OutOfMemory(message) : RuntimeError(message);
}

// Makes `device` current; core restores the host's device once per public call.
inline Status Activate(int device) {
  int now = -1;
  if (gpuGetDevice(&now) == gpuSuccess && now == device) return Status::Ok();
  return Check(gpuSetDevice(device), "gpuSetDevice");
}

}  // namespace gpu
}  // namespace qlink
