// Checks the quantization engines' entry points make of the tensors a host hands over,
// and the words their refusals describe them in.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/context.h"
#include "core/tensor_check.h"

namespace qlink {
namespace quant {

// "float32", "bfloat16", "uint8", as PyTorch names dtypes (without "torch.").
std::string DtypeName(DLDataType t);

bool Is(DLDataType t, uint8_t code, uint8_t bits);

// The options both engines share: bits 2, 3, 4 or 8, and a group size of -1 (one group
// per row) or a positive one, refused naming options->bits / options->group_size.
Status CheckBitsAndGroupSize(int32_t bits, int64_t group_size);

// How refusals name layer `index` of a call: "layers[2]", or "layers[2] 'q_proj'" when it
// has a name.
std::string LayerName(size_t index, const char* name);

// A layer's weight: a tensor of the context, 2-D with both extents >= 1.
Status CheckWeightMatrix(const Context& ctx, const DLTensor& w, const std::string& who);

// Extents as Python writes a shape tuple: (a, b), or (a,) for one.
std::string ShapeText(const int64_t* extents, size_t count);
std::string ShapeText(const DLTensor& t);

// A contiguous tensor of the context on `device` with exactly `shape` and a dtype `ok`
// accepts (described by `wanted` in refusals); `what` names it.
template <typename DtypeOk>
Status CheckTensorOf(const Context& ctx, const DLTensor* t, const std::string& what, int device,
                     std::initializer_list<int64_t> shape, DtypeOk ok, const char* wanted) {
  uint64_t bytes = 0;
  QLINK_RETURN_IF_ERROR(CheckTensor(*t, what, ctx.backend().device_type(), ctx.backend().device_count(), &bytes));
  if (t->device.device_id != device) {
    return InvalidArgument(what + " is on device " + std::to_string(t->device.device_id) +
                           ", not the weight's device " + std::to_string(device));
  }
  bool same = t->ndim == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t extent : shape) same = same && t->shape[d++] == extent;
  if (!same) {
    return InvalidArgument(what + " has shape " + ShapeText(*t) + ", expected " +
                           ShapeText(shape.begin(), shape.size()));
  }
  if (!ok(t->dtype)) return InvalidArgument(what + " has dtype " + DtypeName(t->dtype) + ", expected " + wanted);
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
