// GPTQ's scalar arithmetic, written once for the CPU backend and the GPU kernels so both
// round exactly as GPTQModel's PyTorch code does: every operation one IEEE fp32 operation
// in the reference's order (no fused multiply-add: a product and a difference are rounded
// separately, as torch's matmul-then-subtract rounds them), torch.round = round half to
// even.
#pragma once

#include <cmath>
#include <cstdint>

#include <dlpack/dlpack.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define QLINK_HD __host__ __device__ __forceinline__
#else
#define QLINK_HD inline
#endif

namespace qlink {
namespace quant {

QLINK_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fmul_rn(a, b);
#else
  return a * b;  // the CPU file is built with -ffp-contract=off
#endif
}

QLINK_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

QLINK_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

QLINK_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Quantizer.find_params for one row of one group, from the group's min and max.
QLINK_HD void RangeToParams(float xmin, float xmax, int maxq, bool sym, float* scale, float* zero) {
  xmin = fminf(xmin, 0.0f);
  xmax = fmaxf(xmax, 0.0f);
  if (sym) {
    xmax = fmaxf(fabsf(xmin), xmax);
    if (xmin < 0.0f) xmin = -xmax;
  }
  if (xmin == 0.0f && xmax == 0.0f) {
    xmin = -1.0f;
    xmax = 1.0f;
  }
  *scale = (xmax - xmin) / static_cast<float>(maxq);
  *zero = sym ? static_cast<float>(maxq + 1) / 2.0f : rintf(-xmin / *scale);
}

// quantize(x, scale, zero, maxq): the level (clamp(round(x / scale) + zero, 0, maxq)) and
// the dequantized value scale * (level - zero).
QLINK_HD float QuantizeValue(float x, float scale, float zero, int maxq, uint8_t* level) {
  float q = rintf(x / scale) + zero;
  q = fminf(fmaxf(q, 0.0f), static_cast<float>(maxq));
  *level = static_cast<uint8_t>(q);
  return scale * (q - zero);
}

// bf16 and fp16 as bits, rounded to nearest even, NaN kept quiet.
QLINK_HD float Bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

QLINK_HD uint16_t FloatToBf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

QLINK_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

QLINK_HD uint16_t FloatToHalf(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                               // subnormal or zero
    if (abs < 0x33000000u) return sign;                                  // below half the smallest
    const uint32_t exp = abs >> 23, man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24
    uint32_t half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

// Element i of an fp32, bf16 or fp16 buffer (a DLPack dtype's code and bits) as fp32; and
// back, rounded to nearest even.
QLINK_HD float LoadElement(const void* p, int code, int bits, int64_t i) {
  if (bits == 32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return code == kDLBfloat ? Bf16ToFloat(b) : HalfToFloat(b);
}

QLINK_HD void StoreElement(void* p, int code, int bits, int64_t i, float v) {
  if (bits == 32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = code == kDLBfloat ? FloatToBf16(v) : FloatToHalf(v);
  }
}

}  // namespace quant
}  // namespace qlink
