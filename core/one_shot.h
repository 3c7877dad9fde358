// Workspaces of the one-shot all-reduce: per rank, a flag array and two staging slots in
// device memory its peers write and read directly. One workspace per device list and
// stream tuple: kernels of one workspace run in enqueue order on every device, which the
// epoch handshake relies on.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/device_backend.h"

namespace qlink {

class OneShotWorkspaces {
 public:
  static constexpr size_t kMaxBytes = size_t{1} << 20;  // per buffer; larger ones take two-shot
  static constexpr size_t kFlagBytes = kOneShotFlagsPerRank * sizeof(uint64_t);

  struct Workspace {
    std::vector<int> devices;
    std::vector<void*> base;  // per rank: flags, then slot 0, then slot 1
    uint64_t epoch = 0;
    std::mutex mu;  // held while an epoch is taken and its kernels enqueued
  };

  explicit OneShotWorkspaces(DeviceBackend& backend) : backend_(backend) {}
  ~OneShotWorkspaces();

  Status Get(const std::vector<int>& devices, const std::vector<Stream>& streams, Workspace** out);

 private:
  DeviceBackend& backend_;
  std::mutex mu_;
  std::map<std::pair<std::vector<int>, std::vector<Stream>>, std::unique_ptr<Workspace>> workspaces_;
};

}  // namespace qlink
