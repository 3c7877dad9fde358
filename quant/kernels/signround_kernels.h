// Launchers of SignRound's kernels, one source for CUDA and HIP (built by nvcc or hipcc
// into the GPU backend, called by quant/gpu/gpu_signround.cc). Each enqueues on `stream`
// of the current device and returns the launch's error.
#pragma once

#include "backends/gpu/gpu_runtime.h"
#include "quant/signround/signround_math_api.h"

namespace qlink {
namespace quant {
namespace gpu {

gpuError_t LaunchSignRoundForward(const SignRoundConfig& config, const SignRoundLayer& layer, gpuStream_t stream);
gpuError_t LaunchSignRoundBackward(const SignRoundConfig& config, const SignRoundLayer& layer, gpuStream_t stream);
// The update of one tensor (after keeping it as best where the loss improved).
gpuError_t LaunchSignSgdTensor(const SignSgdStep& step, const SignSgdTensor& tensor, gpuStream_t stream);
// A block's experts (SignRoundMath::ForwardExperts / BackwardExperts): one launch a pass for
// up to 224 experts on CUDA (24 on HIP), expert blockIdx.y of the parameters' table.
gpuError_t LaunchSignRoundExpertsForward(const SignRoundConfig& config, const SignRoundExperts& experts,
                                         gpuStream_t stream);
gpuError_t LaunchSignRoundExpertsBackward(const SignRoundConfig& config, const SignRoundExperts& experts,
                                          gpuStream_t stream);
// Every expert's tensors' update in one launch (StepExperts, before the schedule's).
gpuError_t LaunchSignSgdExperts(const SignSgdStep& step, size_t num_experts, const ExpertTokens& tokens,
                                gpuStream_t stream);
// What follows every tensor's update: best_loss, epoch and the learning rates.
gpuError_t LaunchSignSgdSchedule(const SignSgdStep& step, gpuStream_t stream);

}  // namespace gpu
}  // namespace quant
}  // namespace qlink
