// One qlink_context: a loaded backend, its config, logger, peer topology and events.
#pragma once

#include <memory>

#include <spdlog/logger.h>

#include "backends/device_backend.h"
#include "core/backend_registry.h"
#include "core/config.h"
#include "core/event_pool.h"
#include "core/one_shot.h"
#include "core/scratch_pool.h"
#include "core/topology.h"

namespace qlink {

class Context {
 public:
  static Status Create(const char* config_json, std::unique_ptr<Context>* out);
  ~Context();

  DeviceBackend& backend() { return *loaded_.backend; }
  const DeviceBackend& backend() const { return *loaded_.backend; }
  const Config& config() const { return config_; }
  spdlog::logger& log() { return *log_; }
  Topology& topology() { return *topology_; }
  const Topology& topology() const { return *topology_; }
  EventPool& events() { return *events_; }
  ScratchPool& scratch() { return *scratch_; }
  OneShotWorkspaces& one_shot() { return *one_shot_; }

  // INVALID_ARGUMENT naming `what` unless `device` is one of this context's devices.
  Status CheckDevice(int device, const char* what) const;

 private:
  Context() = default;

  Config config_;
  std::shared_ptr<spdlog::logger> log_;
  LoadedBackend loaded_;
  std::unique_ptr<Topology> topology_;
  std::unique_ptr<EventPool> events_;
  std::unique_ptr<ScratchPool> scratch_;
  std::unique_ptr<OneShotWorkspaces> one_shot_;
};

// Restores the calling thread's current device when a public call returns: backends
// leave the device of their last enqueue current, and the host (PyTorch) keeps its own
// notion of the current device on this thread.
class DeviceRestore {
 public:
  explicit DeviceRestore(DeviceBackend& backend)
      : backend_(backend), device_(backend.device_count() > 0 ? backend.CurrentDevice() : -1) {}
  ~DeviceRestore() {
    if (device_ >= 0 && backend_.CurrentDevice() != device_) backend_.MakeCurrent(device_);
  }
  DeviceRestore(const DeviceRestore&) = delete;
  DeviceRestore& operator=(const DeviceRestore&) = delete;

 private:
  DeviceBackend& backend_;
  const int device_;
};

}  // namespace qlink
