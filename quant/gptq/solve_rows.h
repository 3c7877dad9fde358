// GPTQ's column loop over rows [row_begin, row_end) of one layer on one device, given its
// Hessian's inverse there: the working weight in fp32, group ranges, blocks of 128
// columns through the fused kernel, each block's error spread over the later columns by
// one GEMM, then the outputs written to the layer's device.
#pragma once

#include <functional>
#include <vector>

#include "quant/gptq/hessian_inverse.h"

namespace qlink {
namespace quant {

struct RowsJob {
  const Layer* layer = nullptr;
  int64_t row_begin = 0, row_end = 0;
  int device = 0;               // where the rows are solved
  Stream stream = nullptr;      // of `device`
  Stream out_stream = nullptr;  // of the layer's device, for the outputs' copies
};

// Solves `job`; writes the outputs only if may_write() (which waits until every inverse
// of the call is known) says the call goes ahead. row_loss receives each row's
// sum of (w - q)^2 / d^2.
Status SolveRows(DeviceBackend& backend, QuantMath& math, const HessianInverse& inverse, const RowsJob& job,
                 const GptqOptions& options, const std::function<bool()>& may_write, Workspace* workspace,
                 std::vector<double>* row_loss);

// Each original column's group index (the layer's g_idx).
std::vector<int32_t> GroupIndex(const HessianInverse& inverse, const GptqOptions& options);

}  // namespace quant
}  // namespace qlink
