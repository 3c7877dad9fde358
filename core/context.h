// One qlink_context: a loaded backend, its config, logger, peer topology and events.
#pragma once

#include <memory>

#include <spdlog/logger.h>

#include "backends/device_backend.h"
#include "core/backend_registry.h"
#include "core/config.h"
#include "core/event_pool.h"
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

  // INVALID_ARGUMENT naming `what` unless `device` is one of this context's devices.
  Status CheckDevice(int device, const char* what) const;

 private:
  Context() = default;

  Config config_;
  std::shared_ptr<spdlog::logger> log_;
  LoadedBackend loaded_;
  std::unique_ptr<Topology> topology_;
  std::unique_ptr<EventPool> events_;
};

}  // namespace qlink
