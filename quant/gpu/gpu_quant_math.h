// The GPU backend's QuantMath (CUDA or HIP, from one source): cuBLAS/cuSOLVER or
// hipBLAS/hipSOLVER for the linear algebra, quant/kernels for the rest.
#pragma once

#include <memory>

#include "quant/quant_math.h"

namespace qlink {
namespace quant {

// A QuantMath over `libraries` (loaded now) for `devices` devices, or the reason there is none.
Status MakeGpuQuantMath(const Libraries& libraries, int devices, std::unique_ptr<QuantMath>* out);

}  // namespace quant
}  // namespace qlink
