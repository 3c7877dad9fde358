// The backend's QuantMath for the engine's entry points, its libraries said in the
// context's log once per process for each choice (a warning when they are a slow or
// fallback choice).
#pragma once

#include "core/context.h"
#include "quant/quant_math.h"

namespace qlink {
namespace quant {

Status GetEngineMath(Context& ctx, QuantMath** out);

}  // namespace quant
}  // namespace qlink
