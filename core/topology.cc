#include "core/topology.h"

#include <atomic>
#include <mutex>

#include "core/link_probe.h"

namespace qlink {
namespace {

constexpr int kProbeReps = 5;

std::string Pair(int src, int dst) { return std::to_string(src) + "->" + std::to_string(dst); }

// Exactly one per process, whatever the number of contexts (docs/HOSTS.md). A context whose
// logging is off does not use it up: the next context that logs warnings still gets it.
void WarnOnce(spdlog::logger& log, const std::string& pairs) {
  static std::atomic<bool> warned{false};
  if (!log.should_log(spdlog::level::warn) || warned.exchange(true)) return;
  log.warn(
      "GPUs lack usable peer-to-peer access for pair(s) {}: likely motherboard compatibility (PCIe wiring, "
      "ACS/IOMMU), BIOS settings (Above 4G decoding, Resizable BAR, PCIe generation) or hardware "
      "compatibility; copies between them are staged through host memory and speed may be sub-optimal",
      pairs);
}

}  // namespace

Topology::Topology(DeviceBackend& backend, const P2PConfig& config, spdlog::logger& log)
    : backend_(backend), config_(config), log_(log), n_(backend.device_count()), states_(static_cast<size_t>(n_) * n_) {
  for (int s = 0; s < n_; ++s) {
    for (int d = 0; d < n_; ++d) {
      if (s == d || !backend_.HasPeerAccess()) {
        At(s, d).state = QLINK_PEER_NOT_APPLICABLE;
        At(s, d).reason =
            s == d ? "same device" : std::string("the ") + backend_.name() + " backend has no peer access";
      }
    }
  }
}

PeerState Topology::Judge(int src, int dst) {
  PeerState p;
  if (config_.mode == P2PMode::kOff) {
    p.state = QLINK_PEER_DISABLED;
    p.reason = "p2p.mode is off";
    return p;
  }
  bool capable = false;
  Status s = backend_.CanAccessPeer(dst, src, &capable);
  if (!s.ok() || !capable) {
    p.state = QLINK_PEER_UNSUPPORTED;
    p.reason = s.ok() ? "the runtime reports no peer access from device " + std::to_string(dst) + " to device " +
                            std::to_string(src)
                      : s.message();
    return p;
  }
  const uint64_t probe_bytes = static_cast<uint64_t>(config_.probe_mib) << 20;
  double regular_s = 0;
  if (config_.probe) {
    s = TimeCopy(backend_, src, dst, probe_bytes, CopyPath::kRuntime, kProbeReps, &regular_s);
    if (!s.ok()) {
      p.state = QLINK_PEER_PROBE_REJECTED;
      p.reason = "probe of the regular path failed: " + s.message();
      return p;
    }
  }
  s = backend_.EnablePeerAccess(dst, src);
  if (!s.ok()) {
    p.state = QLINK_PEER_ENABLE_FAILED;
    p.reason = s.message();
    return p;
  }
  p.state = QLINK_PEER_ENABLED;
  if (!config_.probe) return p;
  // The peer path as copies of this size will take it.
  const CopyPath peer_path = probe_bytes < backend_.PullCrossoverBytes() ? CopyPath::kPull : CopyPath::kRuntime;
  double peer_s = 0;
  s = TimeCopy(backend_, src, dst, probe_bytes, peer_path, kProbeReps, &peer_s);
  p.probed = s.ok();
  p.peer_gbps = Gbps(probe_bytes, peer_s);
  p.regular_gbps = Gbps(probe_bytes, regular_s);
  const double ratio = p.regular_gbps > 0 ? p.peer_gbps / p.regular_gbps : 0.0;
  if (!s.ok()) {
    p.state = QLINK_PEER_PROBE_REJECTED;
    p.reason = "probe of the peer path failed: " + s.message();
  } else if (p.peer_gbps < config_.min_gbps || ratio < config_.min_ratio) {
    p.state = QLINK_PEER_PROBE_REJECTED;
    p.reason = fmt::format(
        "probe: {:.1f} GB/s over the peer path, {:.2f}x the regular path; needs p2p.min_gbps {} "
        "and p2p.min_ratio {}",
        p.peer_gbps, ratio, config_.min_gbps, config_.min_ratio);
  }
  return p;
}

Status Topology::EnablePeerAccess(const std::vector<int>& devices) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string refused;
  std::string first_reason;
  for (int src : devices) {
    for (int dst : devices) {
      PeerState& p = At(src, dst);
      if (p.state == QLINK_PEER_NOT_REQUESTED) {
        p = Judge(src, dst);
        log_.debug("peer {}: state {} {}", Pair(src, dst), p.state, p.reason);
      }
      if (p.state != QLINK_PEER_ENABLED && p.state != QLINK_PEER_NOT_APPLICABLE && p.state != QLINK_PEER_DISABLED) {
        refused += (refused.empty() ? "" : ", ") + Pair(src, dst);
        if (first_reason.empty()) first_reason = p.reason;
      }
    }
  }
  if (refused.empty()) return Status::Ok();
  if (config_.mode == P2PMode::kOn) {
    return Unavailable("p2p.mode is on but pair(s) " + refused + " cannot use peer access: " + first_reason);
  }
  WarnOnce(log_, refused);
  return Status::Ok();
}

PeerState Topology::Get(int src, int dst) const {
  std::lock_guard<std::mutex> lock(mu_);
  return At(src, dst);
}

bool Topology::PeerEnabled(int src, int dst) const {
  std::lock_guard<std::mutex> lock(mu_);
  return At(src, dst).state == QLINK_PEER_ENABLED;
}

}  // namespace qlink
