// The ABI's entry points for a block's experts (1.10): signround_experts_qdq,
// signround_experts_qdq_backward and signsgd_experts_step. Every argument is checked as the
// per-layer calls check it, then that the experts are alike (one shape, dtype, device) and
// the token counts; then one SignRoundMath call over all of them.
#pragma once

#include "core/context.h"
#include "quant/signround/signround.h"

namespace qlink {
namespace quant {

Status SignRoundExpertsQdq(Context& ctx, const qlink_signround_experts_args* args, SignRoundPass pass);
Status SignSgdExperts(Context& ctx, const qlink_signsgd_experts_args* args);

}  // namespace quant
}  // namespace qlink
