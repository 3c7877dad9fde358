// Peer topology of one context: which ordered pairs may take the direct peer path, and
// why the others may not.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/logger.h>

#include "backends/device_backend.h"
#include "core/config.h"

namespace qlink {

struct PeerState {
  qlink_peer_state state = QLINK_PEER_NOT_REQUESTED;
  bool probed = false;
  double peer_gbps = 0.0;
  double regular_gbps = 0.0;
  std::string reason;
};

class Topology {
 public:
  Topology(DeviceBackend& backend, const P2PConfig& config, spdlog::logger& log);

  // Judges every ordered pair of `devices` on its own. Mode "on" turns a refused pair
  // into an UNAVAILABLE error naming it; mode "auto" reports it (peer_info, one warning
  // per process).
  Status EnablePeerAccess(const std::vector<int>& devices);
  PeerState Get(int src, int dst) const;
  // Whether copies from src to dst may be read by a kernel on dst directly.
  bool PeerEnabled(int src, int dst) const;

 private:
  PeerState Judge(int src, int dst);
  PeerState& At(int src, int dst) { return states_[static_cast<size_t>(src) * n_ + dst]; }
  const PeerState& At(int src, int dst) const { return states_[static_cast<size_t>(src) * n_ + dst]; }

  DeviceBackend& backend_;
  const P2PConfig config_;
  spdlog::logger& log_;
  const int n_;
  mutable std::mutex mu_;
  std::vector<PeerState> states_;  // n_ x n_, row = src
};

}  // namespace qlink
