// In-process collectives over the devices of one context: broadcast (replica mirrors),
// deterministic reduce (GPTQ Hessian partials) and all-reduce (SignRound gradients).
#pragma once

#include "core/context.h"

namespace qlink {

// Each validates its whole argument struct before enqueuing anything: a refused call
// writes nothing.
Status Broadcast(Context& ctx, const qlink_broadcast_args* args);
Status Reduce(Context& ctx, const qlink_reduce_args* args);
Status AllReduce(Context& ctx, const qlink_all_reduce_args* args);

}  // namespace qlink
