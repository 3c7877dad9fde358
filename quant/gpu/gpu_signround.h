// The GPU backend's SignRoundMath (CUDA or HIP, from one source): quant/kernels'
// signround_kernels, no vendor library.
#pragma once

#include <memory>

#include "quant/signround/signround_math_api.h"

namespace qlink {
namespace quant {

std::unique_ptr<SignRoundMath> MakeGpuSignRoundMath();

}  // namespace quant
}  // namespace qlink
