#include "quant/cpu/cpu_signround.h"

#include <algorithm>
#include <cstring>

namespace qlink {
namespace quant {
namespace {

float Load(Fmt f, const void* p, int64_t i) {
  if (f == Fmt::kF32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return f == Fmt::kBf16 ? Bf16ToFloat(b) : HalfToFloat(b);
}

void Store(Fmt f, void* p, int64_t i, float v) {
  if (f == Fmt::kF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = f == Fmt::kBf16 ? FloatToBf16(v) : FloatToHalf(v);
  }
}

// Group g's parameters, its range factors clamped to [0, 1] (written back by the forward).
SignRoundGroup GroupOf(const SignRoundConfig& c, const SignRoundLayer& l, int64_t g, bool write_back) {
  const int64_t base = g * l.group_len;
  float lo = 0.0f, hi = 0.0f;  // torch.clamp(min, max=0), torch.clamp(max, min=0)
  for (int64_t j = 0; j < l.group_len; ++j) {
    const float w = Load(c.weight, l.weight, base + j);
    lo = std::min(lo, w);
    hi = std::max(hi, w);
  }
  const float min_scale = Clamp(l.min_scale[g], 0.0f, 1.0f), max_scale = Clamp(l.max_scale[g], 0.0f, 1.0f);
  if (write_back) {
    l.min_scale[g] = min_scale;
    l.max_scale[g] = max_scale;
  }
  return SignRoundParams(c, lo, hi, min_scale, max_scale);
}

// Lanes combined as the GPU's warp combines them.
double Combine(double* lanes) {
  for (int half = kSignRoundLanes / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  }
  return lanes[0];
}

class CpuSignRoundMath final : public SignRoundMath {
 public:
  Status Forward(int, void*, const SignRoundConfig& c, const SignRoundLayer& l) override {
    for (int64_t g = 0; g < l.groups(); ++g) {
      const SignRoundGroup p = GroupOf(c, l, g, true);
      const int64_t base = g * l.group_len;
      for (int64_t j = 0; j < l.group_len; ++j) {
        Store(c.weight, l.qdq, base + j, SignRoundQdq(c, p, Load(c.weight, l.weight, base + j), l.v[base + j]));
      }
    }
    return Status::Ok();
  }

  Status Backward(int, void*, const SignRoundConfig& c, const SignRoundLayer& l) override {
    const bool keep = l.step_v != nullptr && l.best_v != nullptr && LossImproved(l.loss, l.best_loss);
    for (int64_t g = 0; g < l.groups(); ++g) {
      const SignRoundGroup p = GroupOf(c, l, g, false);
      const int64_t base = g * l.group_len;
      SignRoundTerms lanes[kSignRoundLanes];
      for (int64_t j = 0; j < l.group_len; ++j) {
        const int64_t i = base + j;
        const float v = l.v[i];
        const float grad_v = SignRoundElementGrad(c, p, Load(c.weight, l.weight, i), v, Load(c.weight, l.grad_qdq, i),
                                                  &lanes[SignRoundLane(j)]);
        if (l.step_v == nullptr) {
          l.grad_v[i] = grad_v;
        } else {
          if (keep) l.best_v[i] = v;
          l.step_v[i] = SignSgdUpdate(v, grad_v, *l.step_lr);
        }
      }
      double product[kSignRoundLanes], quotient[kSignRoundLanes], zero_product[kSignRoundLanes],
          zero_level[kSignRoundLanes];
      for (int k = 0; k < kSignRoundLanes; ++k) {
        product[k] = lanes[k].scale_product;
        quotient[k] = lanes[k].scale_quotient;
        zero_product[k] = lanes[k].zero_product;
        zero_level[k] = lanes[k].zero_level;
      }
      const SignRoundTerms total{Combine(product), Combine(quotient), Combine(zero_product), Combine(zero_level)};
      float grad_min, grad_max;
      SignRoundGroupGrad(c, p, RoundSums(c, total), &grad_min, &grad_max);
      if (l.grad_min_scale != nullptr) l.grad_min_scale[g] = grad_min;
      if (l.grad_max_scale != nullptr) l.grad_max_scale[g] = grad_max;
    }
    return Status::Ok();
  }

  Status Step(int, void*, const SignSgdStep& s) override {
    StepWhere(s, [](size_t) { return true; });
    return Status::Ok();
  }

  // Each expert with tokens through the one-layer pass, in order: on the CPU a group of
  // experts is the loop over them. Without tokens only its best_v is kept (Backward's copy).
  Status ForwardExperts(int device, void* stream, const SignRoundConfig& c, const SignRoundExperts& e) override {
    for (size_t i = 0; i < e.count; ++i) {
      if (e.tokens.Has(i)) QLINK_RETURN_IF_ERROR(Forward(device, stream, c, e.layers[i]));
    }
    return Status::Ok();
  }

  Status BackwardExperts(int device, void* stream, const SignRoundConfig& c, const SignRoundExperts& e) override {
    for (size_t i = 0; i < e.count; ++i) {
      const SignRoundLayer& l = e.layers[i];
      if (e.tokens.Has(i)) {
        QLINK_RETURN_IF_ERROR(Backward(device, stream, c, l));
      } else if (l.step_v != nullptr && l.best_v != nullptr && LossImproved(l.loss, l.best_loss)) {
        std::memcpy(l.best_v, l.v, sizeof(float) * l.rows * l.cols);
      }
    }
    return Status::Ok();
  }

  Status StepExperts(int, void*, const SignSgdStep& s, size_t num_experts, const ExpertTokens& tokens) override {
    const size_t per_expert = s.num_tensors / num_experts;
    StepWhere(s, [&](size_t t) { return tokens.Has(t / per_expert); });
    return Status::Ok();
  }

 private:
  // Step with the update of tensor t only where updated(t); every tensor kept as best.
  template <typename Updated>
  static void StepWhere(const SignSgdStep& s, Updated updated) {
    const bool improved = LossImproved(s.loss, s.best_loss);
    for (size_t t = 0; t < s.num_tensors; ++t) {
      const SignSgdTensor& x = s.tensors[t];
      if (improved && x.best != nullptr) std::memcpy(x.best, x.param, sizeof(float) * x.count);
      if (!updated(t)) continue;
      const float lr = s.lrs[x.lr_group];
      for (int64_t i = 0; i < x.count; ++i) x.param[i] = SignSgdUpdate(x.param[i], x.grad[i], lr);
    }
    if (improved) *s.best_loss = *s.loss;
    if (s.epoch != nullptr) {
      ++*s.epoch;
      for (size_t k = 0; k < s.num_lrs; ++k) s.lrs[k] = LinearLrNext(s.lrs[k], *s.epoch, s.total_iters);
    }
  }
};

}  // namespace

std::unique_ptr<SignRoundMath> MakeCpuSignRoundMath() { return std::make_unique<CpuSignRoundMath>(); }

}  // namespace quant
}  // namespace qlink
