// In-process collectives over the devices of one context: broadcast (replica mirrors),
// deterministic reduce (GPTQ Hessian partials) and all-reduce (SignRound gradients).
#pragma once

#include <vector>

#include "core/context.h"

namespace qlink {

// The ranks of one all-reduce: rank k is the k-th device in index order.
struct AllReduceRanks {
  std::vector<int> dev;
  std::vector<char*> buf;
  std::vector<Stream> stream;
  size_t count = 0;  // fp32 elements per buffer
  bool bf16 = false, signs = false;
  float scale = 1.0f;
};

// An all-reduce validated once and replayed (all_reduce_plan_*; all_reduce is one Build
// and one Execute).
class AllReducePlan {
 public:
  static Status Build(Context& ctx, const qlink_all_reduce_args* args, AllReducePlan* out);
  // Enqueues on `streams` as in qlink_all_reduce_args.
  Status Execute(Context& ctx, const qlink_stream* streams, size_t num_streams) const;

 private:
  AllReduceRanks ranks_;  // without streams
  int32_t algorithm_ = QLINK_ALL_REDUCE_AUTO;
};

// Each validates its whole argument struct before enqueuing anything: a refused call
// writes nothing.
Status Broadcast(Context& ctx, const qlink_broadcast_args* args);
Status Reduce(Context& ctx, const qlink_reduce_args* args);
Status AllReduce(Context& ctx, const qlink_all_reduce_args* args);

}  // namespace qlink
