// All-reduce (SignRound gradients): validated once into ranks, then one of the algorithms
// of all_reduce_algorithms.h per execution.
#include <string>
#include <vector>

#include "core/all_reduce_algorithms.h"
#include "core/collective_buffers.h"
#include "core/collectives.h"
#include "core/stream_list.h"
#include "core/tensor_check.h"

namespace qlink {
namespace {

// Latency-bound sizes: one kernel per rank, synchronized through flags in peer memory
// (no stream events), when every rank can reach every other over a peer link.
bool OneShotApplies(Context& ctx, const std::vector<int>& dev, uint64_t bytes) {
  if (!ctx.backend().HasOneShot() || dev.size() < 2 || bytes > OneShotWorkspaces::kMaxBytes) return false;
  for (int reader : dev) {
    for (int owner : dev) {
      if (!DirectlyReadable(ctx, reader, owner)) return false;
    }
  }
  return true;
}

}  // namespace

Status AllReducePlan::Build(Context& ctx, const qlink_all_reduce_args* a, AllReducePlan* out) {
  if (a == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(a->struct_size, QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE_1_1, "args", "1.1"));
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, a->streams, a->num_streams));
  if (a->op < QLINK_REDUCE_SUM || a->op > QLINK_REDUCE_SIGN) {
    return InvalidArgument("args.op = " + std::to_string(a->op) + " is not a qlink_reduce_op");
  }
  if (a->transport != QLINK_TRANSPORT_FP32 && a->transport != QLINK_TRANSPORT_BF16) {
    return InvalidArgument("args.transport = " + std::to_string(a->transport) + " is not a qlink_transport");
  }
  // Appended in 1.1: a host that does not know the field gets the automatic choice.
  const int32_t algorithm =
      a->struct_size >= QLINK_STRUCT_SIZE(qlink_all_reduce_args, algorithm) ? a->algorithm : QLINK_ALL_REDUCE_AUTO;
  if (algorithm < QLINK_ALL_REDUCE_AUTO || algorithm > QLINK_ALL_REDUCE_HALVING_DOUBLING) {
    return InvalidArgument("args.algorithm = " + std::to_string(algorithm) + " is not a qlink_all_reduce_algorithm");
  }
  uint64_t bytes = 0;
  std::vector<size_t> order;
  QLINK_RETURN_IF_ERROR(CheckPerDevice(ctx, a->buffers, a->num_buffers, "buffers", &bytes, &order));
  const size_t world = order.size();
  if (algorithm == QLINK_ALL_REDUCE_HALVING_DOUBLING) {
    if ((world & (world - 1)) != 0) {
      return InvalidArgument("args.algorithm is halving-doubling, which needs a power-of-two number of buffers, got " +
                             std::to_string(world));
    }
    if (a->transport != QLINK_TRANSPORT_FP32) {
      return InvalidArgument("args.algorithm is halving-doubling, which carries fp32 partial sums: use transport fp32");
    }
  }
  AllReduceRanks r;
  r.count = bytes / 4;
  r.bf16 = a->transport == QLINK_TRANSPORT_BF16;
  r.signs = a->op == QLINK_REDUCE_SIGN;
  r.scale = a->op == QLINK_REDUCE_AVG ? 1.0f / static_cast<float>(world) : 1.0f;
  for (size_t k = 0; k < world; ++k) {  // rank k is the k-th device in index order
    const DLTensor& t = a->buffers[order[k]];
    r.dev.push_back(t.device.device_id);
    r.buf.push_back(const_cast<char*>(TensorBytes(t)));
  }
  out->ranks_ = std::move(r);
  out->algorithm_ = algorithm;
  return Status::Ok();
}

Status AllReducePlan::Execute(Context& ctx, const qlink_stream* streams, size_t num_streams) const {
  if (ranks_.count == 0) return Status::Ok();
  AllReduceRanks r = ranks_;
  for (int d : r.dev) r.stream.push_back(StreamFor(d, streams, num_streams));
  switch (algorithm_) {
    case QLINK_ALL_REDUCE_HALVING_DOUBLING:
      return HalvingDoubling(ctx, r);
    case QLINK_ALL_REDUCE_TWO_SHOT:
      return TwoShot(ctx, r);
    default:
      return OneShotApplies(ctx, r.dev, r.count * 4) ? OneShot(ctx, r) : TwoShot(ctx, r);
  }
}

Status AllReduce(Context& ctx, const qlink_all_reduce_args* a) {
  AllReducePlan plan;
  QLINK_RETURN_IF_ERROR(AllReducePlan::Build(ctx, a, &plan));
  return plan.Execute(ctx, a->streams, a->num_streams);
}

}  // namespace qlink
