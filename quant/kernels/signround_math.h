// SignRound's scalar arithmetic (AutoRound's WrapperLinear over quant_tensor_sym /
// quant_tensor_asym, and the gradients autograd takes through them), written once for the
// CPU backend and the GPU kernels. Every operation is the one IEEE fp32 operation PyTorch
// performs, followed by the rounding to the dtype PyTorch's type promotion gives its
// result (a bf16 weight divided by an fp16 scale is fp32; an fp16 weight by an fp16 scale
// is fp16, computed in fp32 and rounded), so the forward is bit-identical to AutoRound's
// functions run eagerly on the same kind of device.
//
// One group (a row's `group_len` consecutive columns) is the unit: its range, scale and
// zero point, then each element. The backward's per-group sums (autograd's reductions of
// a broadcast scale's gradient) are the one place where the order of additions is not
// PyTorch's: they run in double over a fixed order (32 lanes, element j on lane j % 32,
// lanes combined pairwise), the same on every backend, and round once to fp32.
#pragma once

#include <cmath>
#include <cstdint>

#include "quant/kernels/gptq_math.h"

namespace qlink {
namespace quant {

// The float formats a weight, a scale and an intermediate may have.
enum class Fmt : int32_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

// x rounded (nearest even) to `f`, as a float.
QLINK_HD float RoundTo(Fmt f, float x) {
  if (f == Fmt::kBf16) return Bf16ToFloat(FloatToBf16(x));
  if (f == Fmt::kF16) return HalfToFloat(FloatToHalf(x));
  return x;
}

// PyTorch's result dtype of a binary op on two tensors of these formats.
QLINK_HD Fmt Promote(Fmt a, Fmt b) { return a == b ? a : Fmt::kF32; }

// round_ste's value: (round(x) - x) + x, which is round(x) except where x is infinite.
QLINK_HD float RoundSte(float x) { return Add(Sub(rintf(x), x), x); }

// torch.clamp with NaN kept.
QLINK_HD float Clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

// What one call's arithmetic depends on. SignRoundMath's calls take it across the backend
// library boundary: a change to it (or to Fmt) moves QLINK_BACKEND_INTERFACE_VERSION.
struct SignRoundConfig {
  int32_t bits = 4;
  int32_t sym = 1;
  Fmt weight = Fmt::kBf16;
  Fmt scale = Fmt::kF16;
  float thresh = 1e-5f;  // q_scale_thresh rounded to the scale's format
  // How PyTorch divides a tensor by a Python number on this kind of device: on CUDA (and
  // ROCm) as a product with the fp32 reciprocal, on the CPU as a true division. It
  // matters for asymmetric ranges (maxq = 2^bits - 1).
  int32_t reciprocal_division = 0;

  QLINK_HD float maxq() const {
    return sym ? static_cast<float>(1 << (bits - 1)) : static_cast<float>((1 << bits) - 1);
  }
  QLINK_HD float lowest() const { return sym ? -maxq() : 0.0f; }
  QLINK_HD float highest() const { return sym ? maxq() - 1.0f : maxq(); }
  QLINK_HD Fmt quotient() const { return Promote(weight, scale); }  // dtype of weight / scale
  QLINK_HD float DivByMaxq(float x) const { return reciprocal_division ? Mul(x, Div(1.0f, maxq())) : Div(x, maxq()); }
};

// A group's quantization parameters, from its weight's min (clamped to <= 0) and max
// (clamped to >= 0) and its range factors (already clamped to [0, 1]).
struct SignRoundGroup {
  float wmin = 0, wmax = 0;  // the clamped min and max of the weight
  float min_scale = 1, max_scale = 1;
  float low = 0, high = 0;  // sym: wmin_abs, wmax_abs; asym: wmin, wmax
  float unclamped = 0;      // the scale in its format before q_scale_thresh's clamp
  float scale = 0;          // the scale used, in its format
  float zero = 0;           // asym: the zero point
};

QLINK_HD SignRoundGroup SignRoundParams(const SignRoundConfig& c, float wmin, float wmax, float min_scale,
                                        float max_scale) {
  SignRoundGroup g;
  g.wmin = wmin;
  g.wmax = wmax;
  g.min_scale = min_scale;
  g.max_scale = max_scale;
  if (c.sym) {
    // wmin_abs = -(wmin * min_scale); max_v = (2 * (wmax_abs < wmin_abs) - 1) * max(wmax_abs, wmin_abs):
    // the larger side maps to level -maxq, so the scale is negative where the positive side
    // is the larger.
    g.low = -Mul(wmin, min_scale);
    g.high = Mul(wmax, max_scale);
    const float m = g.high < g.low ? g.low : g.high;
    const float max_v = g.high < g.low ? m : -m;
    g.unclamped = RoundTo(c.scale, c.DivByMaxq(max_v));
    const float s = g.unclamped;
    g.scale = s < 0.0f ? (s > -c.thresh ? -c.thresh : s) : (s < c.thresh ? c.thresh : s);
  } else {
    g.low = Mul(wmin, min_scale);
    g.high = Mul(wmax, max_scale);
    g.unclamped = RoundTo(c.scale, c.DivByMaxq(Sub(g.high, g.low)));
    g.scale = g.unclamped < c.thresh ? c.thresh : g.unclamped;
    g.zero = RoundSte(Div(-g.low, g.scale));
  }
  return g;
}

// One element's w / scale in the quotient's format: the first step of its quant-dequant,
// which the backward's gradient through the division takes again.
QLINK_HD float SignRoundQuotient(const SignRoundConfig& c, const SignRoundGroup& g, float w) {
  return RoundTo(c.quotient(), Div(w, g.scale));
}

// One element's level before the clamp (the backward's mask) from its quotient and v.
QLINK_HD float SignRoundLevel(const SignRoundConfig& c, const SignRoundGroup& g, float quotient, float v) {
  const float q = RoundSte(Add(quotient, v));
  return c.sym ? q : Add(q, g.zero);
}

// A level's quant-dequant in fp32, before its rounding to the weight's format: a kernel
// that converts it to the weight's format as it stores it rounds it once, to the same bits.
QLINK_HD float SignRoundDequant(const SignRoundConfig& c, const SignRoundGroup& g, float level) {
  const float q = Clamp(level, c.lowest(), c.highest());
  return Mul(g.scale, c.sym ? q : Sub(q, g.zero));
}

// One element's quant-dequant, in the weight's format.
QLINK_HD float SignRoundQdq(const SignRoundConfig& c, const SignRoundGroup& g, float w, float v) {
  return RoundTo(c.weight, SignRoundDequant(c, g, SignRoundLevel(c, g, SignRoundQuotient(c, g, w), v)));
}

// One element's share of the backward, given the upstream gradient `grad` of its output:
// the gradient of v (returned) and its terms of the group's sums.
struct SignRoundTerms {
  double scale_product = 0;   // d out / d scale through out = scale * q (fp32 terms)
  double scale_quotient = 0;  // d out / d scale through w / scale (terms in the quotient's format)
  double zero_product = 0;    // asym: d out / d zero through out = scale * (q - zero)
  double zero_level = 0;      // asym: d out / d zero through the level q + zero
};

QLINK_HD float SignRoundElementGrad(const SignRoundConfig& c, const SignRoundGroup& g, float w, float v, float grad,
                                    SignRoundTerms* sums) {
  const float quotient = SignRoundQuotient(c, g, w);
  const float q_unclamped = SignRoundLevel(c, g, quotient, v);
  const float q = Clamp(q_unclamped, c.lowest(), c.highest());
  const bool inside = q_unclamped >= c.lowest() && q_unclamped <= c.highest();
  const float e = c.sym ? q : Sub(q, g.zero);  // what multiplies the scale
  const float grad_e = Mul(grad, g.scale);
  sums->scale_product += Mul(grad, e);
  const float grad_x = inside ? grad_e : 0.0f;  // through the clamp, then round_ste
  if (!c.sym) {
    sums->zero_product += -grad_e;
    sums->zero_level += grad_x;
  }
  // w / scale's gradient with respect to the scale: -grad * ((w / scale) / scale), in the
  // quotient's format.
  const Fmt t = c.quotient();
  const float grad_d = RoundTo(t, grad_x);
  const float twice = RoundTo(t, Div(quotient, g.scale));
  sums->scale_quotient += RoundTo(t, Mul(-grad_d, twice));
  return grad_x;
}

// The group's sums, each rounded as PyTorch's reduction rounds it: to fp32, the
// quotient's term to its format.
struct SignRoundSums {
  float scale_product, scale_quotient, zero_product, zero_level;
};

QLINK_HD SignRoundSums RoundSums(const SignRoundConfig& c, const SignRoundTerms& t) {
  return {static_cast<float>(t.scale_product), RoundTo(c.quotient(), static_cast<float>(t.scale_quotient)),
          static_cast<float>(t.zero_product), static_cast<float>(t.zero_level)};
}

// The gradients of the group's min_scale and max_scale from its sums.
QLINK_HD void SignRoundGroupGrad(const SignRoundConfig& c, const SignRoundGroup& g, const SignRoundSums& s,
                                 float* grad_min_scale, float* grad_max_scale) {
  // The scale's gradient as autograd accumulates it, in the scale's format: the two uses
  // after unsqueeze, then (asym) the zero point's division.
  float grad_scale = RoundTo(c.scale, Add(RoundTo(c.scale, s.scale_product), RoundTo(c.scale, s.scale_quotient)));
  float grad_low_from_zero = 0.0f;
  if (!c.sym) {
    const float grad_zero = Add(s.zero_product, s.zero_level);
    // zero = round_ste(-low / scale): d/d(-low) = grad / scale; d/d scale = -grad * ((-low / scale) / scale)
    grad_low_from_zero = -Div(grad_zero, g.scale);
    const float from_zero = RoundTo(c.scale, Mul(-grad_zero, Div(Div(-g.low, g.scale), g.scale)));
    grad_scale = RoundTo(c.scale, Add(grad_scale, from_zero));
  }
  // Through q_scale_thresh's clamp (where picks the branch, each clamp masks), then the
  // cast to the scale's format (exact back to fp32), then / maxq.
  const float s1 = g.unclamped;
  float passed;
  if (c.sym) {
    passed = s1 < 0.0f ? (s1 <= -c.thresh ? grad_scale : 0.0f) : (s1 >= c.thresh ? grad_scale : 0.0f);
  } else {
    passed = s1 >= c.thresh ? grad_scale : 0.0f;
  }
  const float grad_s0 = c.DivByMaxq(passed);
  if (c.sym) {
    // max_v = sign * max(high, low); torch.maximum splits a tie's gradient in halves.
    const float grad_m = g.high < g.low ? grad_s0 : -grad_s0;
    const bool tie = g.high == g.low;
    const float half = Div(grad_m, 2.0f);
    const float grad_high = tie ? half : (g.high < g.low ? 0.0f : grad_m);
    const float grad_low = tie ? half : (g.high > g.low ? 0.0f : grad_m);
    *grad_max_scale = Mul(grad_high, g.wmax);
    *grad_min_scale = Mul(-grad_low, g.wmin);  // low = -(wmin * min_scale)
  } else {
    // scale = (high - low) / maxq; low also feeds the zero point.
    *grad_max_scale = Mul(grad_s0, g.wmax);
    *grad_min_scale = Mul(Add(-grad_s0, grad_low_from_zero), g.wmin);
  }
}

// Whether this iteration's loss improves on the best so far (the step then keeps the
// parameters as best before updating them, and lowers best_loss); a NULL loss keeps none.
QLINK_HD bool LossImproved(const float* loss, const float* best_loss) { return loss != nullptr && *loss < *best_loss; }

// SignSGD's update of one element (momentum 0, no weight decay: AutoRound's use):
// param.add_(sign(grad), alpha=-lr).
QLINK_HD float SignSgdUpdate(float param, float grad, float lr) {
  const float sign = grad > 0.0f ? 1.0f : (grad < 0.0f ? -1.0f : 0.0f);
  return Add(param, Mul(-lr, sign));
}

// LinearLR(start_factor=1, end_factor=0, total_iters) after its step number `epoch`
// (1-based, the scheduler's last_epoch after the increment): the factor lr is multiplied
// by, computed in double as Python does, applied in fp32 as to a 0-dim fp32 tensor.
QLINK_HD float LinearLrNext(float lr, int64_t epoch, int64_t total_iters) {
  if (epoch > total_iters) return lr;
  const double factor =
      1.0 + (0.0 - 1.0) / (static_cast<double>(total_iters) * 1.0 + static_cast<double>(epoch - 1) * (0.0 - 1.0));
  return Mul(lr, static_cast<float>(factor));
}

// The per-group sums' order: a group's elements in chunks of kSignRoundChunk, chunk c on
// lane c % kSignRoundLanes, each lane adding its elements in order, then lanes combined by
// halves (lane l < half adds lane l + half; 16, 8, 4, 2, 1). On the GPU a lane is a thread
// of the warp that owns the group (the generic kernels) or one of the lanes a thread of a
// smaller team stands for (the team kernels, signround_kernels.cu), and a chunk is one
// vector load.
constexpr int kSignRoundLanes = 32;
constexpr int kSignRoundChunk = 4;

QLINK_HD int SignRoundLane(int64_t j) { return static_cast<int>((j / kSignRoundChunk) % kSignRoundLanes); }

}  // namespace quant
}  // namespace qlink
