// Validation of host-supplied DLTensors, before anything is enqueued.
#pragma once

#include <cstdint>
#include <string>

#include <dlpack/dlpack.h>

#include "backends/status.h"

namespace qlink {

// How refusals name one element of an argument array: "sources[3]".
inline std::string ArgName(const char* side, size_t index) {
  return std::string(side) + "[" + std::to_string(index) + "]";
}

// Refuses a struct_size below `oldest`, the size of the struct's first layout (the
// header's *_STRUCT_SIZE_<major>_<minor>), introduced by ABI `since` ("1.0").
inline Status CheckStructSize(size_t got, size_t oldest, const char* what, const char* since) {
  if (got >= oldest) return Status::Ok();
  return InvalidArgument(std::string(what) + "->struct_size " + std::to_string(got) + " is below the " + since +
                         " size " + std::to_string(oldest));
}

// Checks that `t` (named side[index] in a refusal, e.g. "sources[3]") is a contiguous
// tensor of a device of `device_type` with an id below `device_count`, and gives its size
// in bytes.
Status CheckTensor(const DLTensor& t, const char* side, size_t index, DLDeviceType device_type, int device_count,
                   uint64_t* bytes);
// The same, for a tensor named whole ("layers[2] 'q_proj': weight").
Status CheckTensor(const DLTensor& t, const std::string& name, DLDeviceType device_type, int device_count,
                   uint64_t* bytes);

// Start address of the tensor's bytes.
inline const char* TensorBytes(const DLTensor& t) { return static_cast<const char*>(t.data) + t.byte_offset; }

}  // namespace qlink
