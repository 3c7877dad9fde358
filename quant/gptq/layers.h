// GPTQ's options and layers as the ABI hands them over, checked in full before any work:
// every refusal names the argument (which layer, which tensor, which field).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "plugin_api/qlink.h"
#include "quant/quant_math.h"

namespace qlink {
namespace quant {

struct GptqOptions {
  Grid grid;
  int64_t group_size = -1;  // as given: -1 or a divisor of the columns
  bool desc_act = false;
  bool act_group_aware = false;  // GPTQModel's GAR order (excludes desc_act, static_groups)
  bool static_groups = false;
  bool tf32 = false;
  double damp = 0.01;
  double damp_increment = 0.01;
  double nsamples = 0;
  qlink_gptq_inverse inverse = QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE;
};

// One layer, checked. Outputs are NULL where not wanted.
struct Layer {
  std::string name;  // for messages: the host's name, else "layers[i]"
  int device = 0;    // of the weight, the Hessian and every output
  int64_t rows = 0, cols = 0, groups = 0;
  const DLTensor* weight = nullptr;
  const DLTensor* hessian = nullptr;
  const DLTensor* codes = nullptr;
  const DLTensor* scales = nullptr;
  const DLTensor* zeros = nullptr;
  const DLTensor* g_idx = nullptr;
  const DLTensor* dequantized = nullptr;
};

Status ReadOptions(const qlink_gptq_options* options, GptqOptions* out);

// Checks layers[i] against the context and the options.
Status ReadLayer(const Context& ctx, const qlink_gptq_layer& layer, size_t index, const GptqOptions& options,
                 Layer* out);

// The float dtypes a weight, an activation or a dequantized output may have.
bool IsFloatDtype(DLDataType t);

// The bytes of a tensor's data.
inline const char* DataOf(const DLTensor& t) { return static_cast<const char*>(t.data) + t.byte_offset; }
inline char* MutableDataOf(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

}  // namespace quant
}  // namespace qlink
