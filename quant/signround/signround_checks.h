// The SignRound entry points' argument checks, shared by the per-layer calls (1.7 / 1.9,
// signround.cc) and the experts' calls (1.10, signround_experts.cc): each reads a whole
// argument struct into the backend's types, refusing (naming the field) before anything is
// enqueued.
#pragma once

#include <vector>

#include "core/context.h"
#include "quant/signround/signround.h"
#include "quant/signround/signround_math_api.h"

namespace qlink {
namespace quant {

// One layer of a qlink_signround_args, checked: its device and arithmetic.
struct CheckedLayer {
  int device = 0;
  SignRoundConfig config;
  SignRoundLayer layer;
};

// A qlink_signsgd_args, checked: its device and step; step.tensors points into tensors.
struct CheckedStep {
  int device = 0;
  SignSgdStep step;
  std::vector<SignSgdTensor> tensors;
};

Status CheckSignRoundArgs(const Context& ctx, const qlink_signround_args* args, SignRoundPass pass,
                          std::vector<CheckedLayer>* out);
Status CheckSignSgdArgs(const Context& ctx, const qlink_signsgd_args* args, CheckedStep* out);

}  // namespace quant
}  // namespace qlink
