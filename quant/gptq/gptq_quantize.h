// The ABI's GPTQ entry point behind qlink_api.gptq_quantize.
#pragma once

#include "core/context.h"

namespace qlink {
namespace quant {

Status GptqQuantize(Context& ctx, qlink_gptq_args* args);

}  // namespace quant
}  // namespace qlink
