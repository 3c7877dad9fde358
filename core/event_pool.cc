#include "core/event_pool.h"

namespace qlink {

EventPool::EventPool(DeviceBackend& backend) : backend_(backend), free_(backend.device_count()) {}

EventPool::~EventPool() {
  for (size_t d = 0; d < free_.size(); ++d) {
    for (Event e : free_[d]) backend_.DestroyEvent(static_cast<int>(d), e);
  }
}

Status EventPool::Acquire(int device, Event* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[device];
    if (!list.empty()) {
      *out = list.back();
      list.pop_back();
      return Status::Ok();
    }
  }
  return backend_.CreateEvent(device, out);
}

void EventPool::Release(int device, Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[device].push_back(event);
}

}  // namespace qlink
