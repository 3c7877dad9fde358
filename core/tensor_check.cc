#include "core/tensor_check.h"

namespace qlink {
namespace {

const char* DeviceTypeName(int type) {
  switch (type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLROCM:
      return "rocm";
    case kDLROCMHost:
      return "rocm_host";
    default:
      return "unknown";
  }
}

// `what()` names the tensor; called only on refusal, so the hot path builds no strings.
template <typename Name>
Status Check(const DLTensor& t, Name what, DLDeviceType device_type, int device_count, uint64_t* bytes) {
  if (t.device.device_type != device_type) {
    return InvalidArgument(what() + ": device type " + std::to_string(t.device.device_type) + " (" +
                           DeviceTypeName(t.device.device_type) + ") is not the context's " +
                           DeviceTypeName(device_type));
  }
  if (t.device.device_id < 0 || t.device.device_id >= device_count) {
    return InvalidArgument(what() + ": device id " + std::to_string(t.device.device_id) +
                           " does not exist (the context has " + std::to_string(device_count) + " device(s))");
  }
  if (t.ndim < 0 || t.ndim > 64)
    return InvalidArgument(what() + ": ndim " + std::to_string(t.ndim) + " is out of range");
  if (t.ndim > 0 && t.shape == nullptr)
    return InvalidArgument(what() + ": shape is NULL with ndim " + std::to_string(t.ndim));
  if (t.dtype.bits == 0 || t.dtype.lanes == 0 || (t.dtype.bits * t.dtype.lanes) % 8 != 0) {
    return InvalidArgument(what() + ": dtype of " + std::to_string(t.dtype.bits) + " bits x " +
                           std::to_string(t.dtype.lanes) + " lanes is not a whole number of bytes");
  }
  uint64_t elements = 1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) return InvalidArgument(what() + ": shape[" + std::to_string(d) + "] is negative");
    if (t.shape[d] != 0 && elements > UINT64_MAX / static_cast<uint64_t>(t.shape[d])) {
      return InvalidArgument(what() + ": shape overflows 64 bits");
    }
    elements *= static_cast<uint64_t>(t.shape[d]);
  }
  if (t.strides != nullptr && elements > 1) {
    int64_t expected = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != 1 && t.strides[d] != expected) {
        return InvalidArgument(what() + ": not contiguous (strides[" + std::to_string(d) +
                               "] = " + std::to_string(t.strides[d]) + ", compact layout needs " +
                               std::to_string(expected) + ")");
      }
      expected *= t.shape[d];
    }
  }
  const uint64_t element_bytes = t.dtype.bits * t.dtype.lanes / 8u;
  if (elements > UINT64_MAX / element_bytes) return InvalidArgument(what() + ": byte size overflows 64 bits");
  *bytes = elements * element_bytes;
  if (*bytes > 0 && t.data == nullptr) return InvalidArgument(what() + ": data is NULL");
  return Status::Ok();
}

}  // namespace

Status CheckTensor(const DLTensor& t, const char* side, size_t index, DLDeviceType device_type, int device_count,
                   uint64_t* bytes) {
  return Check(
      t, [&] { return ArgName(side, index); }, device_type, device_count, bytes);
}

Status CheckTensor(const DLTensor& t, const std::string& name, DLDeviceType device_type, int device_count,
                   uint64_t* bytes) {
  return Check(
      t, [&] { return name; }, device_type, device_count, bytes);
}

}  // namespace qlink
