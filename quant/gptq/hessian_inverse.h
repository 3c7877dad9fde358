// The part of GPTQ that depends on the Hessian alone, shared by every layer given that
// Hessian: the column order (act-order or group-aware), the dead columns, and the upper Cholesky factor U of
// the damped inverse (H + damp * mean(diag H) * I)^-1 = U^T U, with damp raised after
// each failed Cholesky as GPTQModel's hessian_inverse does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quant/gptq/device_buffer.h"
#include "quant/gptq/layers.h"

namespace qlink {
namespace quant {

struct HessianInverse {
  int device = 0;
  int64_t n = 0;
  DeviceBuffer u;                       // n x n; its upper triangle is U
  std::vector<int32_t> perm;            // working column -> original column; empty: identity
  std::vector<int32_t> position;        // original column -> working column (perm's inverse); empty: identity
  std::vector<int32_t> group_position;  // group-aware order: original group -> working group
  std::vector<int32_t> dead;            // working columns whose diagonal was zero
  double damp = 0;                      // the damp the factorizations succeeded with
};

// Computes the inverse of the n x n Hessian `h` (on `device`) into *out. A Hessian that
// stays indefinite up to the largest damp tried is INVALID_ARGUMENT naming `who` and the
// damps tried.
Status InvertHessian(DeviceBackend& backend, QuantMath& math, int device, Stream stream, const float* h, int64_t n,
                     const GptqOptions& options, const std::string& who, Workspace* workspace, HessianInverse* out);

// A copy of `from` on `device` (U copied by the runtime), for layers placed away from
// where their inverse was computed. `from`'s device must be idle.
Status CopyInverse(DeviceBackend& backend, const HessianInverse& from, int device, Stream stream, Workspace* workspace,
                   HessianInverse* out);

}  // namespace quant
}  // namespace qlink
