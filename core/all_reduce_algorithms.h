// The in-process all-reduce algorithms, over ranks already validated (AllReducePlan).
// Each enqueues on the ranks' streams, ordered after the work already there and before
// later work, and leaves every rank's buffer bit-identical.
#pragma once

#include "core/collectives.h"

namespace qlink {

// Latency-bound sizes: one kernel per rank, synchronized through flags in peer memory
// (no stream events). Needs every rank to read every other over a peer link.
Status OneShot(Context& ctx, const AllReduceRanks& r);

// Reduce-scatter, then all-gather, reading peers directly where they can.
Status TwoShot(Context& ctx, const AllReduceRanks& r);

// Recursive halving, then recursive doubling: log2(world) pairwise exchanges each way, for
// a power-of-two number of ranks and fp32 transport.
Status HalvingDoubling(Context& ctx, const AllReduceRanks& r);

}  // namespace qlink
