// Timed copies between two devices: the probe behind p2p.probe and `qlink probe`.
#pragma once

#include <cstdint>

#include "backends/device_backend.h"

namespace qlink {

enum class CopyPath { kPull, kRuntime };

// Host wall time of one `bytes` copy src -> dst over `path`, enqueue to completion,
// best of `reps` after a warm-up. Memory is allocated and freed here.
Status TimeCopy(DeviceBackend& backend, int src, int dst, uint64_t bytes, CopyPath path, int reps, double* seconds);

inline double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }

}  // namespace qlink
