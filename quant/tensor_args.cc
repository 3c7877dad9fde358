#include "quant/tensor_args.h"

namespace qlink {
namespace quant {

std::string DtypeName(DLDataType t) {
  const char* code = t.code == kDLFloat    ? "float"
                     : t.code == kDLBfloat ? "bfloat"
                     : t.code == kDLInt    ? "int"
                     : t.code == kDLUInt   ? "uint"
                                           : "code";
  return std::string(code) + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

bool Is(DLDataType t, uint8_t code, uint8_t bits) { return t.code == code && t.bits == bits && t.lanes == 1; }

Status CheckBitsAndGroupSize(int32_t bits, int64_t group_size) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 8) {
    return InvalidArgument("options->bits = " + std::to_string(bits) + " is not one of 2, 3, 4, 8");
  }
  if (group_size != -1 && group_size < 1) {
    return InvalidArgument("options->group_size = " + std::to_string(group_size) +
                           " is neither -1 (one group per row) nor positive");
  }
  return Status::Ok();
}

std::string LayerName(size_t index, const char* name) {
  const std::string at = "layers[" + std::to_string(index) + "]";
  return name != nullptr && name[0] != '\0' ? at + " '" + name + "'" : at;
}

Status CheckWeightMatrix(const Context& ctx, const DLTensor& w, const std::string& who) {
  uint64_t bytes = 0;
  QLINK_RETURN_IF_ERROR(
      CheckTensor(w, who + ": weight", ctx.backend().device_type(), ctx.backend().device_count(), &bytes));
  if (w.ndim != 2 || w.shape[0] < 1 || w.shape[1] < 1) {
    return InvalidArgument(who + ": weight has shape " + ShapeText(w) + ", expected (rows, columns), both >= 1");
  }
  return Status::Ok();
}

std::string ShapeText(const int64_t* extents, size_t count) {
  std::string s = "(";
  for (size_t d = 0; d < count; ++d) s += (d > 0 ? ", " : "") + std::to_string(extents[d]);
  return s + (count == 1 ? ",)" : ")");
}

std::string ShapeText(const DLTensor& t) { return ShapeText(t.shape, static_cast<size_t>(t.ndim)); }

}  // namespace quant
}  // namespace qlink
