// The collective kernels as host loops: the CPU backend's, and the reference the GPU
// kernels are tested against.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qlink {
namespace cpu {

// Round to nearest even, as __float2bfloat16_rn; NaN stays a quiet NaN.
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t x);

void ReduceSum(void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count, float scale,
               bool signs);
void CastToBf16(uint16_t* out, const float* in, size_t count);
void ExpandSigns(float* out, const int8_t* signs, size_t count);

}  // namespace cpu
}  // namespace qlink
