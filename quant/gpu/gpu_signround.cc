#include "quant/gpu/gpu_signround.h"

#include "backends/gpu/gpu_status.h"
#include "quant/kernels/signround_kernels.h"

namespace qlink {
namespace quant {
namespace {

using ::qlink::gpu::Activate;
using ::qlink::gpu::Check;

gpuStream_t S(void* stream) { return static_cast<gpuStream_t>(stream); }

class GpuSignRoundMath final : public SignRoundMath {
 public:
  Status Forward(int device, void* stream, const SignRoundConfig& config, const SignRoundLayer& layer) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchSignRoundForward(Reciprocal(config), layer, S(stream)), "signround forward kernel");
  }

  Status Backward(int device, void* stream, const SignRoundConfig& config, const SignRoundLayer& layer) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchSignRoundBackward(Reciprocal(config), layer, S(stream)), "signround backward kernel");
  }

  Status Step(int device, void* stream, const SignSgdStep& step) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    for (size_t t = 0; t < step.num_tensors; ++t) {
      QLINK_RETURN_IF_ERROR(Check(gpu::LaunchSignSgdTensor(step, step.tensors[t], S(stream)), "signsgd kernel"));
    }
    return Check(gpu::LaunchSignSgdSchedule(step, S(stream)), "signsgd schedule kernel");
  }

  Status ForwardExperts(int device, void* stream, const SignRoundConfig& config,
                        const SignRoundExperts& experts) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchSignRoundExpertsForward(Reciprocal(config), experts, S(stream)),
                 "signround experts forward kernel");
  }

  Status BackwardExperts(int device, void* stream, const SignRoundConfig& config,
                         const SignRoundExperts& experts) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    return Check(gpu::LaunchSignRoundExpertsBackward(Reciprocal(config), experts, S(stream)),
                 "signround experts backward kernel");
  }

  Status StepExperts(int device, void* stream, const SignSgdStep& step, size_t num_experts,
                     const ExpertTokens& tokens) override {
    QLINK_RETURN_IF_ERROR(Activate(device));
    QLINK_RETURN_IF_ERROR(
        Check(gpu::LaunchSignSgdExperts(step, num_experts, tokens, S(stream)), "signsgd experts kernel"));
    return Check(gpu::LaunchSignSgdSchedule(step, S(stream)), "signsgd schedule kernel");
  }

 private:
  // PyTorch divides a GPU tensor by a Python number as a product with its reciprocal.
  static SignRoundConfig Reciprocal(SignRoundConfig c) {
    c.reciprocal_division = 1;
    return c;
  }
};

}  // namespace

std::unique_ptr<SignRoundMath> MakeGpuSignRoundMath() { return std::make_unique<GpuSignRoundMath>(); }

}  // namespace quant
}  // namespace qlink
