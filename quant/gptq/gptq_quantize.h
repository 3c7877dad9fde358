// The ABI's GPTQ entry points behind qlink_api.hessian_accumulate and gptq_quantize.
#pragma once

#include "core/context.h"

namespace qlink {
namespace quant {

Status HessianAccumulate(Context& ctx, const qlink_hessian_args* args);
Status GptqQuantize(Context& ctx, qlink_gptq_args* args);

}  // namespace quant
}  // namespace qlink
