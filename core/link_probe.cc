#include "core/link_probe.h"

#include <algorithm>
#include <chrono>

namespace qlink {

Status TimeCopy(DeviceBackend& backend, int src, int dst, uint64_t bytes, CopyPath path, int reps, double* seconds) {
  void* from = nullptr;
  void* to = nullptr;
  Stream stream = nullptr;
  auto release = [&] {
    if (stream != nullptr) backend.DestroyStream(dst, stream);
    if (to != nullptr) backend.Free(dst, to);
    if (from != nullptr) backend.Free(src, from);
  };
  Status s = backend.Allocate(src, bytes, &from);
  if (s.ok()) s = backend.Allocate(dst, bytes, &to);
  if (s.ok()) s = backend.CreateStream(dst, &stream);
  if (s.ok()) s = backend.Memset(src, from, 0x5a, bytes, nullptr);
  if (s.ok()) s = backend.SynchronizeStream(src, nullptr);
  const CopyLeaf leaf{from, to, bytes};
  auto copy_once = [&] {
    return path == CopyPath::kPull ? backend.PullLeaves(dst, &leaf, 1, stream)
                                   : backend.CopyLeaves(dst, src, &leaf, 1, stream);
  };
  double best = 1e30;
  for (int r = -1; s.ok() && r < reps; ++r) {  // r == -1 is the warm-up
    auto t0 = std::chrono::steady_clock::now();
    s = copy_once();
    if (s.ok()) s = backend.SynchronizeStream(dst, stream);
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    if (r >= 0) best = std::min(best, dt.count());
  }
  release();
  if (s.ok()) *seconds = best;
  return s;
}

}  // namespace qlink
