// Launchers of the collective kernels (built by nvcc, called from the backend's host code).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/device_backend.h"

namespace qlink {
namespace cuda {

// At most this many inputs per ReduceSum launch: they travel in the kernel parameters.
constexpr size_t kMaxReduceInputs = 64;
// Blocks of one one-shot launch; each rank's flag array holds world x this many flags.
constexpr int kOneShotMaxBlocks = 32;

cudaError_t LaunchReduceSum(void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count,
                            float scale, bool signs, int sm_count, cudaStream_t stream);
cudaError_t LaunchCastToBf16(uint16_t* out, const float* in, size_t count, int sm_count, cudaStream_t stream);
cudaError_t LaunchExpandSigns(float* out, const int8_t* signs, size_t count, int sm_count, cudaStream_t stream);
cudaError_t LaunchOneShot(const OneShotAllReduce& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace qlink
