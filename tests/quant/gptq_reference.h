// An independent reference of GPTQ as GPTQModel's GPTQ.quantize and Quantizer run it,
// in ATen operations column by column (slow, obvious), for the engine's tests.
#pragma once

#include <cmath>
#include <vector>

#include <ATen/ATen.h>

namespace qlink_test {

struct ReferenceOptions {
  int bits = 4;
  int group_size = 128;
  bool sym = true;
  bool desc_act = false;
  bool act_group_aware = false;
  bool static_groups = false;
  double damp = 0.01;
  double damp_auto_increment = 0.01;
};

struct ReferenceResult {
  at::Tensor codes;   // uint8 (rows, cols)
  at::Tensor scales;  // (rows, groups)
  at::Tensor zeros;
  at::Tensor g_idx;     // int32 (cols)
  at::Tensor weight;    // dequantized fp32
  double loss_sum = 0;  // sum of (w - q)^2 / d^2 / 2
  double damp = 0;
};

// Quantizer.find_params(x, weight=True): per row of x.
inline void FindParams(const at::Tensor& x, int maxq, bool sym, at::Tensor* scale, at::Tensor* zero) {
  at::Tensor zero_row = at::zeros({x.size(0)}, x.options());
  at::Tensor xmin = at::minimum(std::get<0>(x.min(1)), zero_row);
  at::Tensor xmax = at::maximum(std::get<0>(x.max(1)), zero_row);
  if (sym) {
    xmax = at::maximum(xmin.abs(), xmax);
    at::Tensor neg = xmin < 0;
    xmin = at::where(neg, -xmax, xmin);
  }
  at::Tensor flat = (xmin == 0) & (xmax == 0);
  xmin = at::where(flat, at::full_like(xmin, -1), xmin);
  xmax = at::where(flat, at::full_like(xmax, 1), xmax);
  *scale = (xmax - xmin) / static_cast<float>(maxq);
  *zero = sym ? at::full_like(*scale, (maxq + 1) / 2.0) : at::round(-xmin / *scale);
}

// quantize(x, scale, zero, maxq): the levels and the dequantized values.
inline at::Tensor Quantize(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero, int maxq,
                           at::Tensor* levels) {
  *levels = at::clamp(at::round(x / scale) + zero, 0, maxq);
  return scale * (*levels - zero);
}

inline ReferenceResult ReferenceGptq(const at::Tensor& weight, const at::Tensor& hessian, const ReferenceOptions& o) {
  const int maxq = (1 << o.bits) - 1;
  const int64_t rows = weight.size(0), cols = weight.size(1), block = 128;
  const int64_t gs = o.group_size == -1 ? cols : o.group_size;
  at::Tensor W = weight.to(at::kFloat).clone();
  at::Tensor H = hessian.clone();
  at::Tensor scale, zero;
  FindParams(W, maxq, o.sym, &scale, &zero);  // before dead columns: the whole-row range
  at::Tensor dead = H.diagonal() == 0;
  H.diagonal().masked_fill_(dead, 1);
  W.index_put_({at::indexing::Slice(), dead}, 0);
  std::vector<at::Tensor> static_scale, static_zero;
  if (o.static_groups) {
    for (int64_t g = 0; g < cols; g += gs) {
      at::Tensor s, z;
      FindParams(W.slice(1, g, g + gs), maxq, o.sym, &s, &z);
      static_scale.push_back(s);
      static_zero.push_back(z);
    }
  }
  at::Tensor perm, invperm, group_order;
  if (o.desc_act) {
    perm = at::argsort(H.diagonal(), /*stable=*/true, /*dim=*/0, /*descending=*/true);
  } else if (o.act_group_aware) {
    // GPTQModel's gar.py: each group's columns by their diagonal entry, the groups by their
    // largest one, both descending.
    const int64_t groups = cols / gs;
    auto [values, local] = at::sort(H.diagonal().reshape({groups, gs}), /*stable=*/true, /*dim=*/1,
                                    /*descending=*/true);
    group_order = at::argsort(values.select(1, 0), /*stable=*/true, /*dim=*/0, /*descending=*/true);
    perm = (local + at::arange(groups).unsqueeze(1) * gs).index_select(0, group_order).reshape({-1});
  }
  if (perm.defined()) {
    W = W.index_select(1, perm);
    H = H.index_select(0, perm).index_select(1, perm);
    invperm = at::argsort(perm);
  }
  // hessian_inverse: damp raised until both factorizations succeed.
  at::Tensor Hinv;
  double damp = o.damp;
  // The diagonal's mean summed in double (torch's own float reduction order differs between
  // devices and releases; this one is the engine's, so results can be compared bit for bit).
  const float mean = static_cast<float>(H.diagonal().to(at::kDouble).mean().item<double>());
  while (damp > 0 && damp < 1) {
    at::Tensor Hd = H.clone();
    Hd.diagonal().add_(static_cast<float>(damp) * mean);
    try {
      at::Tensor L = at::linalg_cholesky(Hd);
      Hinv = at::linalg_cholesky(at::cholesky_inverse(L), /*upper=*/true);
      break;
    } catch (const c10::Error&) {
      Hinv = at::Tensor();
      if (o.damp_auto_increment <= 0) break;
      damp += o.damp_auto_increment;
    }
  }
  if (!Hinv.defined()) throw std::runtime_error("reference: Hessian not positive definite");

  at::Tensor Q = at::zeros_like(W), levels_all = at::zeros_like(W), losses = at::zeros_like(W);
  std::vector<at::Tensor> scales, zeros;
  int64_t now_idx = 1;
  for (int64_t i1 = 0; i1 < cols; i1 += block) {
    const int64_t i2 = std::min(i1 + block, cols), count = i2 - i1;
    at::Tensor W1 = W.slice(1, i1, i2).clone();
    at::Tensor Q1 = at::zeros_like(W1), Err1 = at::zeros_like(W1), L1 = at::zeros_like(W1), Lv1 = at::zeros_like(W1);
    at::Tensor Hinv1 = Hinv.slice(0, i1, i2).slice(1, i1, i2);
    for (int64_t i = 0; i < count; ++i) {
      at::Tensor w = W1.select(1, i);
      at::Tensor d = Hinv1[i][i];
      if (o.group_size != -1) {
        if (!o.static_groups) {
          if ((i1 + i) % gs == 0) FindParams(W.slice(1, i1 + i, i1 + i + gs), maxq, o.sym, &scale, &zero);
          if ((i1 + i) / gs - now_idx == -1) {
            scales.push_back(scale);
            zeros.push_back(zero);
            ++now_idx;
          }
        } else {
          int64_t idx = i1 + i;
          if (o.desc_act) idx = perm[idx].item<int64_t>();
          scale = static_scale[idx / gs];
          zero = static_zero[idx / gs];
        }
      }
      at::Tensor lv;
      at::Tensor q = Quantize(w.unsqueeze(1), scale.unsqueeze(1), zero.unsqueeze(1), maxq, &lv).flatten();
      Q1.select(1, i).copy_(q);
      Lv1.select(1, i).copy_(lv.flatten());
      L1.select(1, i).copy_((w - q).pow(2) / d.pow(2));
      at::Tensor err1 = (w - q) / d;
      W1.slice(1, i).sub_(err1.unsqueeze(1).matmul(Hinv1[i].slice(0, i).unsqueeze(0)));
      Err1.select(1, i).copy_(err1);
    }
    Q.slice(1, i1, i2).copy_(Q1);
    levels_all.slice(1, i1, i2).copy_(Lv1);
    losses.slice(1, i1, i2).copy_(L1 / 2);
    W.slice(1, i2).sub_(Err1.matmul(Hinv.slice(0, i1, i2).slice(1, i2)));
  }
  std::vector<int32_t> g(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) {
    g[i] = static_cast<int32_t>((o.static_groups && o.desc_act ? perm[i].item<int64_t>() : i) / gs);
  }
  at::Tensor g_idx = at::tensor(g, at::kInt);
  if (perm.defined()) {
    Q = Q.index_select(1, invperm);
    levels_all = levels_all.index_select(1, invperm);
  }
  if (o.desc_act) g_idx = g_idx.index_select(0, invperm);
  if (o.act_group_aware) {  // the groups' ranges back in the groups' own order
    const at::Tensor position = at::argsort(group_order);
    std::vector<at::Tensor> by_group;
    for (int64_t k = 0; k < position.size(0); ++k) by_group.push_back(scales[position[k].item<int64_t>()]);
    scales = by_group;
    by_group.clear();
    for (int64_t k = 0; k < position.size(0); ++k) by_group.push_back(zeros[position[k].item<int64_t>()]);
    zeros = by_group;
  }
  ReferenceResult r;
  if (o.static_groups) {
    scales = static_scale;
    zeros = static_zero;
  }
  if (scales.empty()) {
    scales.push_back(scale);
    zeros.push_back(zero);
  }
  for (auto& s : scales) s = s.reshape({rows, 1});
  for (auto& z : zeros) z = z.reshape({rows, 1});
  r.scales = at::cat(scales, 1);
  r.zeros = at::cat(zeros, 1);
  r.codes = levels_all.to(at::kByte);
  r.g_idx = g_idx;
  r.weight = Q;
  r.loss_sum = losses.sum().item<double>();
  r.damp = damp;
  return r;
}

}  // namespace qlink_test
