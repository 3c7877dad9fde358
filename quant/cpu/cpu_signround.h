// The CPU backend's SignRoundMath: the shared arithmetic (quant/kernels/signround_math.h)
// in plain loops over host memory, synchronously, summing in the GPU kernels' lane order.
#pragma once

#include <memory>

#include "quant/signround/signround_math_api.h"

namespace qlink {
namespace quant {

std::unique_ptr<SignRoundMath> MakeCpuSignRoundMath();

}  // namespace quant
}  // namespace qlink
