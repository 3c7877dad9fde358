// The ABI's Hessian entry point behind qlink_api.hessian_accumulate: H += X^T X per device,
// one triangle by the vendor's rank-k update in IEEE fp32 (or, for 16-bit activations under
// the tensor precision, on its tensor cores: qlink's kernel on CUDA, GEMMs elsewhere), then
// mirrored.
#pragma once

#include "core/context.h"

namespace qlink {
namespace quant {

Status HessianAccumulate(Context& ctx, const qlink_hessian_args* args);

}  // namespace quant
}  // namespace qlink
