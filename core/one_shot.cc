#include "core/one_shot.h"

namespace qlink {

OneShotWorkspaces::~OneShotWorkspaces() {
  for (auto& [key, ws] : workspaces_) {
    for (size_t k = 0; k < ws->base.size(); ++k) backend_.Free(ws->devices[k], ws->base[k]);
  }
}

Status OneShotWorkspaces::Get(const std::vector<int>& devices, const std::vector<Stream>& streams, Workspace** out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = workspaces_[{devices, streams}];
  if (!slot) {
    auto ws = std::make_unique<Workspace>();
    ws->devices = devices;
    const size_t bytes = kFlagBytes + 2 * kMaxBytes;
    Status s;
    for (size_t k = 0; s.ok() && k < devices.size(); ++k) {
      void* p = nullptr;
      s = backend_.Allocate(devices[k], bytes, &p);
      if (!s.ok()) break;
      ws->base.push_back(p);
      s = backend_.Memset(devices[k], p, 0, kFlagBytes, nullptr);  // epochs start above 0
      if (s.ok()) s = backend_.SynchronizeStream(devices[k], nullptr);
    }
    if (!s.ok()) {
      for (size_t k = 0; k < ws->base.size(); ++k) backend_.Free(devices[k], ws->base[k]);
      workspaces_.erase({devices, streams});
      return s;
    }
    slot = std::move(ws);
  }
  *out = slot.get();
  return Status::Ok();
}

}  // namespace qlink
