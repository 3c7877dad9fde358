// Launchers of the collective kernels (built by nvcc, called from the backend's host code).
// Their limits are the interface's (device_backend.h): at most kMaxParticipants inputs or
// ranks, which travel in the kernel parameters, and kOneShotMaxBlocks blocks a one-shot.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/gpu/gpu_runtime.h"

#include "backends/device_backend.h"

namespace qlink {
namespace gpu {

gpuError_t LaunchReduceSum(void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                           float scale, bool signs, int sm_count, gpuStream_t stream);
gpuError_t LaunchCastToBf16(uint16_t* out, const float* in, size_t count, int sm_count, gpuStream_t stream);
gpuError_t LaunchExpandSigns(float* out, const int8_t* signs, size_t count, int sm_count, gpuStream_t stream);
gpuError_t LaunchOneShot(const OneShotAllReduce& args, gpuStream_t stream);

}  // namespace gpu
}  // namespace qlink
