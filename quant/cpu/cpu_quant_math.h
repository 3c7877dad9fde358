// The CPU backend's QuantMath: BLAS/LAPACK for the linear algebra, plain loops for the
// kernels, on host memory, synchronously (the CPU backend's streams are no-ops).
#pragma once

#include <memory>

#include "quant/quant_math.h"

namespace qlink {
namespace quant {

// A QuantMath over the LAPACK library `libraries.solver` (loaded now), or the reason there
// is none.
Status MakeCpuQuantMath(const Libraries& libraries, std::unique_ptr<QuantMath>* out);

}  // namespace quant
}  // namespace qlink
