// libFuzzer target: any bytes as the JSON config text. ParseConfig must return a status
// (never crash, leak or read out of bounds), and an accepted config must hold values in
// the documented ranges.
#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/json.hpp>

#include "core/config.h"

namespace {

void Require(bool holds) {
  if (!holds) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);  // NUL-terminated copy
  qlink::Config config;
  const qlink::Status status = qlink::ParseConfig(text.c_str(), &config);
  if (!status.ok()) {
    Require(status.code() == QLINK_INVALID_ARGUMENT && !status.message().empty());
    return 0;
  }
  Require(!config.backend.empty());
  Require(config.cpu_devices >= 1 && config.cpu_devices <= 256);
  Require(config.p2p.probe_mib >= 1 && config.p2p.probe_mib <= 4096);
  Require(config.p2p.min_gbps >= 0.0 && config.p2p.min_gbps <= 1e5);
  Require(config.p2p.min_ratio >= 0.0 && config.p2p.min_ratio <= 1e3);
  boost::system::error_code ec;
  Require(boost::json::parse(config.backend_options, ec).is_object() && !ec);
  return 0;
}
