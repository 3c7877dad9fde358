#include "backends/cpu/cpu_kernels.h"

#include <cstring>

namespace qlink {
namespace cpu {

uint16_t FloatToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void ReduceSum(void* out, const void* const* inputs, size_t num_inputs, bool input_bf16, size_t count, float scale,
               bool signs) {
  auto value = [&](size_t k, size_t i) {
    return input_bf16 ? Bf16ToFloat(static_cast<const uint16_t*>(inputs[k])[i])
                      : static_cast<const float*>(inputs[k])[i];
  };
  for (size_t i = 0; i < count; ++i) {
    float sum = value(0, i);
    for (size_t k = 1; k < num_inputs; ++k) sum += value(k, i);
    sum *= scale;
    if (signs) {
      static_cast<int8_t*>(out)[i] = static_cast<int8_t>((sum > 0.0f) - (sum < 0.0f));
    } else {
      static_cast<float*>(out)[i] = sum;
    }
  }
}

void CastToBf16(uint16_t* out, const float* in, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = FloatToBf16(in[i]);
}

void ExpandSigns(float* out, const int8_t* signs, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(signs[i]);
}

}  // namespace cpu
}  // namespace qlink
