// What the fault-injecting test backend breaks, read from the context config's
// backend_options object. Every fault is off by default.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "backends/status.h"

namespace qlink {

struct FaultOptions {
  int devices = 2;
  std::vector<int> stream_delay_ms;                    // per device; unlisted devices have none
  std::set<std::pair<int, int>> unsupported_pairs;     // (src, dst): dst cannot access src's memory
  std::set<std::pair<int, int>> enable_failing_pairs;  // (src, dst): capable, but enabling fails
  int64_t fail_leaf = -1;                              // the n-th leaf copied (0-based, over the backend's life) fails
  int64_t fail_allocation = -1;                        // the n-th Allocate call (0-based) fails
  int lost_device = -1;                                // this device is lost at the first copy call touching it
  int64_t lost_after_copies = 0;                       // after this many, and every later call on it fails
};

// Parses the backend_options JSON text; unknown keys, wrong types and devices out of
// range are refused with a message naming the key.
Status ParseFaultOptions(const char* json, FaultOptions* out);

}  // namespace qlink
