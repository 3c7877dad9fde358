// Broadcast (replica mirrors): a binary tree of copy plans from the root's leaves.
#include <deque>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/copy_plan.h"
#include "core/stream_list.h"
#include "core/tensor_check.h"

namespace qlink {

Status Broadcast(Context& ctx, const qlink_broadcast_args* a) {
  if (a == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(a->struct_size, QLINK_BROADCAST_ARGS_STRUCT_SIZE_1_1, "args", "1.1"));
  const size_t leaves = a->num_leaves, replicas = a->num_replicas;
  if (leaves == 0 || replicas == 0) return Status::Ok();
  if (a->sources == nullptr) return InvalidArgument("args.sources is NULL with num_leaves > 0");
  if (a->destinations == nullptr) return InvalidArgument("args.destinations is NULL with num_replicas > 0");
  const uint32_t flags = a->struct_size >= QLINK_STRUCT_SIZE(qlink_broadcast_args, flags) ? a->flags : 0;
  const int root = a->sources[0].device.device_id;
  for (size_t i = 1; i < leaves; ++i) {
    if (a->sources[i].device.device_id != root) {
      return InvalidArgument(ArgName("sources", i) + " is on device " + std::to_string(a->sources[i].device.device_id) +
                             ", not the broadcast root " + std::to_string(root) + " of sources[0]");
    }
  }
  std::vector<int> replica_device(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    const DLTensor* d = a->destinations + r * leaves;
    replica_device[r] = d[0].device.device_id;
    for (size_t i = 0; i < leaves; ++i) {
      const int dev = d[i].device.device_id;
      if (dev != replica_device[r] || dev == root) {
        return InvalidArgument(
            ArgName("destinations", r * leaves + i) + " is on device " + std::to_string(dev) +
            (dev == root ? ", the root's"
                         : ", not replica " + std::to_string(r) + "'s device " + std::to_string(replica_device[r])));
      }
    }
    for (size_t q = 0; q < r; ++q) {
      if (replica_device[q] == replica_device[r]) {
        return InvalidArgument("replicas " + std::to_string(q) + " and " + std::to_string(r) + " are both on device " +
                               std::to_string(replica_device[r]));
      }
    }
  }
  // Everything validated at once (sizes, devices, overlaps across all replicas).
  std::vector<DLTensor> all_sources;
  all_sources.reserve(leaves * replicas);
  for (size_t r = 0; r < replicas; ++r) all_sources.insert(all_sources.end(), a->sources, a->sources + leaves);
  qlink_copy_args whole{sizeof(qlink_copy_args),
                        all_sources.data(),
                        a->destinations,
                        leaves * replicas,
                        a->streams,
                        a->num_streams,
                        flags};
  CopyPlan check;
  QLINK_RETURN_IF_ERROR(CopyPlan::Build(ctx, &whole, &check));

  // Binary tree: every holder relays to one more device per round, so each round
  // doubles the holders and no link carries the data twice.
  std::vector<const DLTensor*> holders = {a->sources};
  std::deque<size_t> pending;
  for (size_t r = 0; r < replicas; ++r) pending.push_back(r);
  std::vector<CopyPlan> rounds;
  while (!pending.empty()) {
    std::vector<DLTensor> src, dst;
    std::vector<const DLTensor*> next = holders;
    for (const DLTensor* h : holders) {
      if (pending.empty()) break;
      const DLTensor* to = a->destinations + pending.front() * leaves;
      pending.pop_front();
      src.insert(src.end(), h, h + leaves);
      dst.insert(dst.end(), to, to + leaves);
      next.push_back(to);
    }
    // The host's promises cover the root's sources: only the first round reads nothing else.
    qlink_copy_args round{sizeof(qlink_copy_args),
                          src.data(),
                          dst.data(),
                          src.size(),
                          a->streams,
                          a->num_streams,
                          rounds.empty() ? flags & ~uint32_t{QLINK_COPY_WAIT} : 0u};
    rounds.emplace_back();
    QLINK_RETURN_IF_ERROR(CopyPlan::Build(ctx, &round, &rounds.back()));
    holders = std::move(next);
  }
  for (const CopyPlan& round : rounds) QLINK_RETURN_IF_ERROR(round.Execute(ctx, a->streams, a->num_streams));
  if (flags & QLINK_COPY_WAIT) {  // a replica that relayed in an early round may still be receiving
    for (int dev : replica_device) {
      QLINK_RETURN_IF_ERROR(ctx.backend().SynchronizeStream(dev, StreamFor(dev, a->streams, a->num_streams)));
    }
  }
  return Status::Ok();
}

}  // namespace qlink
