// The copy hot path: validate a batch, group its leaves by destination, pick a path per
// leaf, then enqueue with the stream joins that order it after the sources' producers.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/context.h"

namespace qlink {

// Everything that lands on one destination device.
struct DestinationWork {
  int device = 0;
  std::vector<int> joined_sources;         // other devices whose stream this one waits for
  std::vector<CopyLeaf> pulled;            // one launch on `device`
  std::unique_ptr<PreparedPull> prepared;  // instead of `pulled`, laid out for replays (prepared plans)
  std::vector<std::pair<int, std::vector<CopyLeaf>>> runtime;  // runtime copies per source device
};

class CopyPlan {
 public:
  // Validates `args` completely before planning: a refused batch enqueues nothing.
  static Status Build(Context& ctx, const qlink_copy_args* args, CopyPlan* out);
  // Lays the pulled leaves out once for many Executes (copy_plan_create).
  Status Prepare(Context& ctx);
  // Enqueues the plan; streams as in qlink_copy_args.
  Status Execute(Context& ctx, const qlink_stream* streams, size_t num_streams) const;

 private:
  std::vector<DestinationWork> work_;
  std::vector<int> source_devices_;  // distinct devices some other device waits for
  uint32_t flags_ = 0;               // qlink_copy_flags
};

}  // namespace qlink
