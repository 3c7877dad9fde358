#include "quant/gptq/hessian_inverse.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace qlink {
namespace quant {
namespace {

// GPTQModel's group-aware reordering (its gar.py): groups in descending order of their
// largest diagonal entry, each group's columns in descending order of theirs; ties keep
// the column order. Returns the working order of the columns and fills *group_position.
std::vector<int32_t> GroupAwareOrder(const std::vector<float>& diag, int64_t group_size,
                                     std::vector<int32_t>* group_position) {
  const int64_t n = static_cast<int64_t>(diag.size()), groups = n / group_size;
  auto descending = [&](int32_t a, int32_t b) { return diag[a] > diag[b]; };
  std::vector<int32_t> local(static_cast<size_t>(n));
  std::vector<float> largest(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const auto first = local.begin() + g * group_size, last = first + group_size;
    std::iota(first, last, static_cast<int32_t>(g * group_size));
    std::stable_sort(first, last, descending);
    largest[g] = diag[*first];
  }
  std::vector<int32_t> group_order(static_cast<size_t>(groups));
  std::iota(group_order.begin(), group_order.end(), 0);
  std::stable_sort(group_order.begin(), group_order.end(),
                   [&](int32_t a, int32_t b) { return largest[a] > largest[b]; });
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(n));
  group_position->assign(static_cast<size_t>(groups), 0);
  for (int64_t k = 0; k < groups; ++k) {
    const int32_t g = group_order[k];
    (*group_position)[g] = static_cast<int32_t>(k);
    order.insert(order.end(), local.begin() + g * group_size, local.begin() + (g + 1) * group_size);
  }
  return order;
}

std::string Damp(double d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.5g", d);
  return text;
}

}  // namespace

Status InvertHessian(DeviceBackend& backend, QuantMath& math, int device, Stream stream, const float* h, int64_t n,
                     const GptqOptions& options, const std::string& who, Workspace* workspace, HessianInverse* out) {
  out->device = device;
  out->n = n;
  // The diagonal decides the dead columns, the column order and the damp's scale.
  std::vector<float> diag(static_cast<size_t>(n));
  {
    DeviceBuffer d;
    QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * n, &d));
    QLINK_RETURN_IF_ERROR(math.Diagonal(device, stream, h, n, d.as<float>()));
    QLINK_RETURN_IF_ERROR(backend.SynchronizeStream(device, stream));
    QLINK_RETURN_IF_ERROR(backend.CopyToHost(device, diag.data(), d.as<float>(), sizeof(float) * n));
  }
  std::vector<bool> dead(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    dead[i] = diag[i] == 0.0f;
    if (dead[i]) diag[i] = 1.0f;  // H[dead, dead] = 1
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (options.desc_act) {
    // torch.argsort(diag, descending=True), ties kept in column order.
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return diag[a] > diag[b]; });
  } else if (options.act_group_aware) {
    order = GroupAwareOrder(diag, options.group_size, &out->group_position);
  }
  if (options.desc_act || options.act_group_aware) {
    out->perm = order;
    out->position.resize(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) out->position[order[c]] = static_cast<int32_t>(c);
  }
  // The triangular inverse factors the Hessian with its working columns in reverse order.
  const bool triangular = options.inverse == QLINK_GPTQ_INVERSE_TRIANGULAR;
  DeviceBuffer perm;
  QLINK_RETURN_IF_ERROR(
      Upload(backend, triangular ? std::vector<int32_t>(order.rbegin(), order.rend()) : out->perm, *workspace, &perm));
  out->dead.clear();
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += diag[order[i]];
    if (dead[order[i]]) out->dead.push_back(static_cast<int32_t>(i));
  }
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  // Two n x n buffers while inverting: the damped Hessian and its factor, then the inverse
  // and its factor (kept as U).
  DeviceBuffer factor;
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * n * n, &factor));
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * n * n, &out->u));
  float* l = factor.as<float>();
  float* u = out->u.as<float>();
  const int32_t* p = perm.as<int32_t>();  // null for the columns in their order
  double damp = options.damp;
  const double first = damp;
  int tries = 0;
  while (damp > 0 && damp < 1) {
    ++tries;
    // Either way U ends in the column-major upper triangle of u; mirrored into the lower
    // one it is U row-major in the upper triangle, where the column loop reads it.
    QLINK_RETURN_IF_ERROR(math.PrepareHessian(device, stream, h, n, p, static_cast<float>(damp) * mean, l));
    bool ok = false;
    QLINK_RETURN_IF_ERROR(math.Potrf(device, stream, l, n, /*lower=*/true, &ok));
    if (ok && triangular) {
      // l holds J H J = L L^T. Then H^-1 = J L^-T L^-1 J = U^T U with U = J L^-1 J, upper
      // triangular: L^-1 reversed element by element.
      QLINK_RETURN_IF_ERROR(math.TriangularInverse(device, stream, l, n, /*lower=*/true));
      QLINK_RETURN_IF_ERROR(math.Reverse(device, stream, l, u, n * n));
    } else if (ok) {
      // PyTorch's sequence, call for call: L = linalg.cholesky(H) (potrf lower),
      // cholesky_inverse(L), then linalg.cholesky(., upper=True) (potrf upper).
      QLINK_RETURN_IF_ERROR(math.CholeskyInverse(device, stream, l, u, n));
      QLINK_RETURN_IF_ERROR(math.Potrf(device, stream, u, n, /*lower=*/false, &ok));
    }
    if (ok) QLINK_RETURN_IF_ERROR(math.MirrorTriangle(device, stream, u, n, /*lower_to_upper=*/false));
    if (ok) {
      out->damp = damp;
      return backend.SynchronizeStream(device, stream);
    }
    if (options.damp_increment <= 0) break;
    damp += options.damp_increment;
  }
  const double last = first + (tries - 1) * options.damp_increment;
  return InvalidArgument(who + ": the Hessian is not positive definite with damp " + Damp(first) +
                         (tries > 1 ? " .. " + Damp(last) + " (" + std::to_string(tries) + " damps tried, step " +
                                          Damp(options.damp_increment) + ")"
                                    : " (options->damp_auto_increment is 0: no other damp tried)"));
}

Status CopyInverse(DeviceBackend& backend, const HessianInverse& from, int device, Stream stream, Workspace* workspace,
                   HessianInverse* out) {
  out->device = device;
  out->n = from.n;
  out->perm = from.perm;
  out->position = from.position;
  out->group_position = from.group_position;
  out->dead = from.dead;
  out->damp = from.damp;
  const uint64_t bytes = sizeof(float) * from.n * from.n;
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, bytes, &out->u));
  const CopyLeaf leaf{from.u.as<float>(), out->u.as<float>(), bytes};
  return backend.CopyLeaves(device, from.device, &leaf, 1, stream);
}

}  // namespace quant
}  // namespace qlink
