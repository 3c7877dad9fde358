// SignRound's per-vendor part: the fused quant-dequant forward and backward of AutoRound's
// WrapperLinear and the SignSGD step, one kernel pass each, on the devices of one backend
// (the CPU backend's loops, the GPU backend's kernels in quant/kernels). The ABI's entry
// points (quant/signround/signround.cc) check every argument, then call these. Part of the
// backend interface (DeviceBackend::GetSignRoundMath): a change here, or to the
// SignRoundConfig of quant/kernels/signround_math.h, moves QLINK_BACKEND_INTERFACE_VERSION.
//
// Conventions: pointers are in `device`'s memory; every call enqueues on `stream` of
// `device` (making it current) and returns without waiting.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/status.h"
#include "quant/kernels/signround_math.h"

namespace qlink {
namespace quant {

// One wrapped linear: its weight (rows x cols, row-major, in config.weight's format) in
// groups of group_len consecutive columns, groups = rows * cols / group_len.
struct SignRoundLayer {
  const void* weight = nullptr;
  int64_t rows = 0, cols = 0, group_len = 0;
  const float* v = nullptr;         // rows x cols, the rounding offsets
  float* min_scale = nullptr;       // groups; the forward clamps both to [0, 1] in place
  float* max_scale = nullptr;       //   (WrapperLinear's minmax_scale_bound)
  void* qdq = nullptr;              // forward: rows x cols, the weight's format
  const void* grad_qdq = nullptr;   // backward: the gradient of qdq, the weight's format
  float* grad_v = nullptr;          // backward: rows x cols; NULL with a step
  float* grad_min_scale = nullptr;  // backward: groups
  float* grad_max_scale = nullptr;
  // A backward with SignSGD's step of v: v -= *step_lr * sign(grad_v) in place of grad_v
  // written, v first copied to best_v where *loss < *best_loss (best_loss only read).
  float* step_v = nullptr;  // v, writable; NULL: no step (grad_v written)
  float* best_v = nullptr;  // rows x cols; NULL: not kept
  const float* step_lr = nullptr;
  const float* loss = nullptr;  // NULL: no best kept
  const float* best_loss = nullptr;
  QLINK_HD int64_t groups() const { return rows * cols / group_len; }
};

// One tensor SignSGD updates: param -= lr[group] * sign(grad), `count` fp32 elements.
struct SignSgdTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* best = nullptr;  // where param is copied first when the loss improved; NULL: none
  int64_t count = 0;
  int32_t lr_group = 0;  // its learning rate: lrs[lr_group]
};

struct SignSgdStep {
  const SignSgdTensor* tensors = nullptr;  // host memory
  size_t num_tensors = 0;
  float* lrs = nullptr;  // device: the groups' learning rates, fp32
  size_t num_lrs = 0;
  int64_t* epoch = nullptr;     // device: LinearLR's last_epoch; NULL: no schedule
  int64_t total_iters = 0;      // LinearLR's total_iters
  const float* loss = nullptr;  // device: this iteration's loss; NULL: no best-parameter keeping
  float* best_loss = nullptr;   // device: the lowest loss so far, lowered to `loss` when it improved
};

// Which experts of a block's grouped calls have routed tokens this iteration: `counts`
// (device memory, one per expert, int32 or int64 as `bits` says) nonzero; NULL: every one.
// An expert without tokens is skipped as AutoRound skips an expert its router gave none
// (its wrapper not called, its parameters without a gradient for SignSGD to take).
struct ExpertTokens {
  const void* counts = nullptr;
  int32_t bits = 64;
  QLINK_HD bool Has(size_t e) const {
    if (counts == nullptr) return true;
    return bits == 32 ? static_cast<const int32_t*>(counts)[e] != 0 : static_cast<const int64_t*>(counts)[e] != 0;
  }
};

// A block's experts: `count` layers of one shape and format (host memory), on one device.
struct SignRoundExperts {
  const SignRoundLayer* layers = nullptr;
  size_t count = 0;
  ExpertTokens tokens;
};

class SignRoundMath {
 public:
  virtual ~SignRoundMath() = default;
  // qdq = WrapperLinear's quant-dequant of weight with v, min_scale, max_scale.
  virtual Status Forward(int device, void* stream, const SignRoundConfig& config, const SignRoundLayer& layer) = 0;
  // grad_v, grad_min_scale, grad_max_scale (overwritten) from grad_qdq, as autograd
  // computes them through the forward (round as a straight-through estimator); with
  // step_v, v's SignSGD step instead of grad_v (SignSgdUpdate, as Step would take it).
  virtual Status Backward(int device, void* stream, const SignRoundConfig& config, const SignRoundLayer& layer) = 0;
  // Keeps the parameters as best (when loss < best_loss), then the SignSGD update of every
  // tensor, then the schedule: best_loss lowered, epoch advanced, each lr multiplied by
  // LinearLR's factor.
  virtual Status Step(int device, void* stream, const SignSgdStep& step) = 0;
  // Forward and Backward of every expert with tokens, one kernel pass over them all. An
  // expert without tokens is left as it is (qdq, its range factors and gradients not
  // written; v not stepped), but for best_v: the best copy covers every expert, as
  // AutoRound's collect_best_params does.
  virtual Status ForwardExperts(int device, void* stream, const SignRoundConfig& config,
                                const SignRoundExperts& experts) = 0;
  virtual Status BackwardExperts(int device, void* stream, const SignRoundConfig& config,
                                 const SignRoundExperts& experts) = 0;
  // Step over tensors laid out expert-major (tensor e * per_expert + k is expert e's k-th,
  // of one count for every e; per_expert = num_tensors / num_experts): an expert without
  // tokens is not updated, but kept as best with the rest; the schedule advances once.
  virtual Status StepExperts(int device, void* stream, const SignSgdStep& step, size_t num_experts,
                             const ExpertTokens& tokens) = 0;
};

}  // namespace quant
}  // namespace qlink
