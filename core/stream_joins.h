// Events taken from a context's pool for one public call: recorded on one device's
// stream, waited for on others, all given back when the call is done (a wait captures
// the recorded work, so the pool may hand an event out again right away).
#pragma once

#include <utility>
#include <vector>

#include "core/context.h"

namespace qlink {

class StreamJoins {
 public:
  explicit StreamJoins(Context& ctx) : backend_(ctx.backend()), pool_(ctx.events()) {}
  ~StreamJoins() {
    for (auto& [device, event] : taken_) pool_.Release(device, event);
  }
  StreamJoins(const StreamJoins&) = delete;
  StreamJoins& operator=(const StreamJoins&) = delete;

  // An event marking the work enqueued on `stream` of `device` so far.
  Status Record(int device, Stream stream, Event* out) {
    QLINK_RETURN_IF_ERROR(pool_.Acquire(device, out));
    taken_.emplace_back(device, *out);
    return backend_.RecordEvent(device, *out, stream);
  }

  Status Wait(int device, Stream stream, Event event) { return backend_.StreamWaitEvent(device, stream, event); }

  // Every stream of `devices` (streams[k] of devices[k]) waits for the work enqueued so
  // far on every other one.
  Status JoinAll(const std::vector<int>& devices, const std::vector<Stream>& streams) {
    if (devices.size() < 2) return Status::Ok();
    std::vector<Event> marks(devices.size());
    for (size_t k = 0; k < devices.size(); ++k) QLINK_RETURN_IF_ERROR(Record(devices[k], streams[k], &marks[k]));
    for (size_t k = 0; k < devices.size(); ++k) {
      for (size_t j = 0; j < devices.size(); ++j) {
        if (j != k) QLINK_RETURN_IF_ERROR(Wait(devices[k], streams[k], marks[j]));
      }
    }
    return Status::Ok();
  }

 private:
  DeviceBackend& backend_;
  EventPool& pool_;
  std::vector<std::pair<int, Event>> taken_;
};

}  // namespace qlink
