// The ABI's SignRound entry points behind qlink_api.signround_qdq, signround_qdq_backward
// and signsgd_step: every argument checked (refusals naming the layer and the field), then
// the backend's SignRoundMath enqueued on each device's stream.
#pragma once

#include "core/context.h"

namespace qlink {
namespace quant {

enum class SignRoundPass { kForward, kBackward };

Status SignRoundQdq(Context& ctx, const qlink_signround_args* args, SignRoundPass pass);
Status SignSgd(Context& ctx, const qlink_signsgd_args* args);

}  // namespace quant
}  // namespace qlink
