#include "core/stream_list.h"

#include <string>

#include "core/tensor_check.h"

namespace qlink {

Stream StreamFor(int device, const qlink_stream* streams, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    if (streams[k].device.device_id == device) return streams[k].stream;
  }
  return nullptr;
}

Status CheckStreams(const Context& ctx, const qlink_stream* streams, size_t num_streams) {
  if (num_streams > 0 && streams == nullptr) return InvalidArgument("streams is NULL with num_streams > 0");
  const DeviceBackend& b = ctx.backend();
  for (size_t k = 0; k < num_streams; ++k) {
    const DLDevice& d = streams[k].device;
    if (d.device_type != b.device_type() || d.device_id < 0 || d.device_id >= b.device_count()) {
      return InvalidArgument(ArgName("streams", k) + ": device (type " + std::to_string(d.device_type) + ", id " +
                             std::to_string(d.device_id) + ") is not a device of the context");
    }
    for (size_t j = 0; j < k; ++j) {
      if (streams[j].device.device_id == d.device_id) {
        return InvalidArgument(ArgName("streams", k) + ": device " + std::to_string(d.device_id) +
                               " already has a stream in " + ArgName("streams", j));
      }
    }
  }
  return Status::Ok();
}

}  // namespace qlink
