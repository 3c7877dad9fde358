// Reusable events per device. An event is taken for one join (record on the source
// stream, wait on the destination stream) and given back once the wait is enqueued:
// the wait captures the recorded work, so re-recording later is safe, while sharing one
// event between threads mid-join is not.
#pragma once

#include <mutex>
#include <vector>

#include "backends/device_backend.h"

namespace qlink {

class EventPool {
 public:
  explicit EventPool(DeviceBackend& backend);
  ~EventPool();

  Status Acquire(int device, Event* out);
  void Release(int device, Event event);

 private:
  DeviceBackend& backend_;
  std::mutex mu_;
  std::vector<std::vector<Event>> free_;  // per device
};

}  // namespace qlink
