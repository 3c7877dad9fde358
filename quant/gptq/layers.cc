#include "quant/gptq/layers.h"

#include <cmath>

#include "core/tensor_check.h"
#include "quant/tensor_args.h"

namespace qlink {
namespace quant {

bool IsFloatDtype(DLDataType t) { return Is(t, kDLFloat, 32) || Is(t, kDLBfloat, 16) || Is(t, kDLFloat, 16); }

Status ReadOptions(const qlink_gptq_options* o, GptqOptions* out) {
  if (o == nullptr) return InvalidArgument("args->options is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(o->struct_size, QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_4, "options", "1.4"));
  QLINK_RETURN_IF_ERROR(CheckBitsAndGroupSize(o->bits, o->group_size));
  if (o->static_groups && o->group_size == -1) {
    return InvalidArgument("options->static_groups needs a group_size, got -1");
  }
  if (!(o->damp > 0 && o->damp < 1)) {
    return InvalidArgument("options->damp = " + std::to_string(o->damp) + " is outside (0, 1)");
  }
  if (!(o->damp_auto_increment >= 0 && o->damp_auto_increment < 1)) {
    return InvalidArgument("options->damp_auto_increment = " + std::to_string(o->damp_auto_increment) +
                           " is outside [0, 1)");
  }
  if (!(o->nsamples >= 0) || std::isinf(o->nsamples)) {
    return InvalidArgument("options->nsamples = " + std::to_string(o->nsamples) + " is not a finite count >= 0");
  }
  const bool act_group_aware = o->struct_size >= QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_5 && o->act_group_aware != 0;
  if (act_group_aware && o->group_size == -1) {
    return InvalidArgument("options->act_group_aware needs a group_size, got -1");
  }
  if (act_group_aware && (o->desc_act || o->static_groups)) {
    return InvalidArgument(std::string("options->act_group_aware excludes options->") +
                           (o->desc_act ? "desc_act" : "static_groups"));
  }
  const int32_t inverse =
      o->struct_size >= QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_11 ? o->inverse : QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE;
  if (inverse != QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE && inverse != QLINK_GPTQ_INVERSE_TRIANGULAR) {
    return InvalidArgument("options->inverse = " + std::to_string(inverse) +
                           " is not a qlink_gptq_inverse (0: CHOLESKY_INVERSE, 1: TRIANGULAR)");
  }
  out->grid.bits = o->bits;
  out->grid.sym = o->sym != 0;
  out->group_size = o->group_size;
  out->desc_act = o->desc_act != 0;
  out->act_group_aware = act_group_aware;
  out->static_groups = o->static_groups != 0;
  out->tf32 = o->tf32 != 0;
  out->damp = o->damp;
  out->damp_increment = o->damp_auto_increment;
  out->nsamples = o->nsamples;
  out->inverse = static_cast<qlink_gptq_inverse>(inverse);
  return Status::Ok();
}

Status ReadLayer(const Context& ctx, const qlink_gptq_layer& l, size_t index, const GptqOptions& options, Layer* out) {
  const std::string at = "layers[" + std::to_string(index) + "]";
  QLINK_RETURN_IF_ERROR(CheckStructSize(l.struct_size, QLINK_GPTQ_LAYER_STRUCT_SIZE_1_4, at.c_str(), "1.4"));
  out->name = LayerName(index, l.name);
  const std::string& who = out->name;
  if (l.weight == nullptr) return InvalidArgument(who + ": weight is NULL");
  if (l.hessian == nullptr) return InvalidArgument(who + ": hessian is NULL");
  const DLTensor& w = *l.weight;
  QLINK_RETURN_IF_ERROR(CheckWeightMatrix(ctx, w, who));
  if (!IsFloatDtype(w.dtype)) {
    return InvalidArgument(who + ": weight has dtype " + DtypeName(w.dtype) +
                           ", expected float32, bfloat16 or float16");
  }
  out->device = w.device.device_id;
  out->rows = w.shape[0];
  out->cols = w.shape[1];
  if (options.group_size != -1 && out->cols % options.group_size != 0) {
    return InvalidArgument(who + ": options->group_size " + std::to_string(options.group_size) +
                           " does not divide the weight's " + std::to_string(out->cols) + " columns");
  }
  out->groups = options.group_size == -1 ? 1 : out->cols / options.group_size;
  const int64_t rows = out->rows, cols = out->cols, groups = out->groups;
  auto fp32 = [](DLDataType t) { return Is(t, kDLFloat, 32); };
  QLINK_RETURN_IF_ERROR(CheckTensorOf(ctx, l.hessian, who + ": hessian", out->device, {cols, cols}, fp32, "float32"));
  auto optional = [&](const DLTensor* t, const char* field, std::initializer_list<int64_t> shape, auto ok,
                      const char* wanted, const DLTensor** slot) {
    *slot = t;
    if (t == nullptr) return Status::Ok();
    return CheckTensorOf(ctx, t, who + ": " + field, out->device, shape, ok, wanted);
  };
  QLINK_RETURN_IF_ERROR(optional(
      l.codes, "codes", {rows, cols}, [](DLDataType t) { return Is(t, kDLUInt, 8); }, "uint8", &out->codes));
  QLINK_RETURN_IF_ERROR(optional(l.scales, "scales", {rows, groups}, fp32, "float32", &out->scales));
  QLINK_RETURN_IF_ERROR(optional(l.zeros, "zeros", {rows, groups}, fp32, "float32", &out->zeros));
  QLINK_RETURN_IF_ERROR(optional(
      l.g_idx, "g_idx", {cols}, [](DLDataType t) { return Is(t, kDLInt, 32); }, "int32", &out->g_idx));
  QLINK_RETURN_IF_ERROR(optional(l.dequantized, "dequantized", {rows, cols}, IsFloatDtype,
                                 "float32, bfloat16 or float16", &out->dequantized));
  out->weight = l.weight;
  out->hessian = l.hessian;
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
