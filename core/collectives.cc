#include "core/collectives.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "core/copy_plan.h"
#include "core/stream_joins.h"
#include "core/tensor_check.h"

namespace qlink {
namespace {

constexpr size_t kChunkAlign = 64;  // elements: owned chunks start 256-byte aligned

Status CheckFp32(const DLTensor& t, const char* side, size_t i) {
  if (t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1) return Status::Ok();
  return InvalidArgument(ArgName(side, i) + ": dtype must be float32, got code " + std::to_string(t.dtype.code) + " with " +
                         std::to_string(t.dtype.bits) + " bits x " + std::to_string(t.dtype.lanes) + " lanes");
}

// One fp32 buffer per device, all of one size, no two overlapping. Gives the byte size
// and the buffers' indices in device-index order.
Status CheckPerDevice(const Context& ctx, const DLTensor* t, size_t n, const char* side, uint64_t* bytes,
                      std::vector<size_t>* order) {
  if (n == 0) return InvalidArgument(std::string(side) + " is empty");
  if (t == nullptr) return InvalidArgument(std::string(side) + " is NULL");
  if (n > kMaxParticipants) {
    return InvalidArgument(std::string(side) + " has " + std::to_string(n) + " buffers; at most " +
                           std::to_string(kMaxParticipants));
  }
  const DeviceBackend& b = ctx.backend();
  for (size_t i = 0; i < n; ++i) {
    uint64_t got = 0;
    QLINK_RETURN_IF_ERROR(CheckTensor(t[i], side, i, b.device_type(), b.device_count(), &got));
    QLINK_RETURN_IF_ERROR(CheckFp32(t[i], side, i));
    if (i == 0) *bytes = got;
    if (got != *bytes) {
      return InvalidArgument(ArgName(side, i) + " has " + std::to_string(got) + " bytes but " + ArgName(side, 0) + " has " +
                             std::to_string(*bytes));
    }
  }
  order->resize(n);
  for (size_t i = 0; i < n; ++i) (*order)[i] = i;
  std::sort(order->begin(), order->end(),
            [&](size_t x, size_t y) { return t[x].device.device_id < t[y].device.device_id; });
  for (size_t k = 1; k < n; ++k) {
    const size_t a = std::min((*order)[k - 1], (*order)[k]), c = std::max((*order)[k - 1], (*order)[k]);
    if (t[a].device.device_id == t[c].device.device_id) {
      return InvalidArgument(ArgName(side, c) + " is on device " + std::to_string(t[c].device.device_id) + " like " +
                             ArgName(side, a) + ": one buffer per device");
    }
  }
  // Virtual CPU devices share one address space, so distinct devices do not imply
  // distinct memory.
  std::vector<size_t> by_address(*order);
  std::sort(by_address.begin(), by_address.end(), [&](size_t x, size_t y) { return TensorBytes(t[x]) < TensorBytes(t[y]); });
  for (size_t k = 1; k < n && *bytes > 0; ++k) {
    if (TensorBytes(t[by_address[k]]) < TensorBytes(t[by_address[k - 1]]) + *bytes) {
      return InvalidArgument(ArgName(side, std::max(by_address[k], by_address[k - 1])) + " overlaps " +
                             ArgName(side, std::min(by_address[k], by_address[k - 1])));
    }
  }
  return Status::Ok();
}

// Whether `reader` may read `owner`'s memory in place: the same device, a peer link, or
// host memory shared by a backend without peer access (the CPU backend's virtual devices).
bool DirectlyReadable(Context& ctx, int reader, int owner) {
  return reader == owner || !ctx.backend().HasPeerAccess() || ctx.topology().PeerEnabled(owner, reader);
}

// Where `reader` reads `bytes` of `owner`'s memory at `ptr`: in place where it directly
// can, else from a scratch copy staged by the runtime on `stream` (of reader).
Status Readable(Context& ctx, int reader, int owner, const void* ptr, size_t bytes, Stream stream,
                BorrowedScratch* scratch, const void** out) {
  if (DirectlyReadable(ctx, reader, owner)) {
    *out = ptr;
    return Status::Ok();
  }
  void* staged = nullptr;
  QLINK_RETURN_IF_ERROR(scratch->Take(reader, bytes, stream, &staged));
  const CopyLeaf leaf{ptr, staged, bytes};
  *out = staged;
  return ctx.backend().CopyLeaves(reader, owner, &leaf, 1, stream);
}

// Every stream of `devices` waits for the work enqueued so far on every other one.
Status JoinAll(StreamJoins& joins, const std::vector<int>& devices, const std::vector<Stream>& streams) {
  if (devices.size() < 2) return Status::Ok();
  std::vector<Event> marks(devices.size());
  for (size_t k = 0; k < devices.size(); ++k) QLINK_RETURN_IF_ERROR(joins.Record(devices[k], streams[k], &marks[k]));
  for (size_t k = 0; k < devices.size(); ++k) {
    for (size_t j = 0; j < devices.size(); ++j) {
      if (j != k) QLINK_RETURN_IF_ERROR(joins.Wait(devices[k], streams[k], marks[j]));
    }
  }
  return Status::Ok();
}

using Ranks = AllReduceRanks;

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

Status OneShot(Context& ctx, const Ranks& r) {
  const std::vector<int>& dev = r.dev;
  OneShotWorkspaces::Workspace* ws = nullptr;
  QLINK_RETURN_IF_ERROR(ctx.one_shot().Get(dev, r.stream, &ws));
  std::lock_guard<std::mutex> lock(ws->mu);
  const uint64_t epoch = ++ws->epoch;
  const size_t slot = OneShotWorkspaces::kFlagBytes + (epoch % 2) * OneShotWorkspaces::kMaxBytes;
  std::vector<void*> staging(dev.size());
  std::vector<uint64_t*> flags(dev.size());
  for (size_t k = 0; k < dev.size(); ++k) {
    staging[k] = static_cast<char*>(ws->base[k]) + slot;
    flags[k] = static_cast<uint64_t*>(ws->base[k]);
  }
  OneShotAllReduce args;
  args.world = static_cast<int>(dev.size());
  args.count = r.count;
  args.staging = staging.data();
  args.flags = flags.data();
  args.epoch = epoch;
  args.bf16 = r.bf16;
  args.scale = r.scale;
  args.signs = r.signs;
  for (size_t k = 0; k < dev.size(); ++k) {
    args.rank = static_cast<int>(k);
    args.input = args.output = reinterpret_cast<float*>(r.buf[k]);
    QLINK_RETURN_IF_ERROR(ctx.backend().OneShot(dev[k], args, r.stream[k]));
  }
  return Status::Ok();
}

// Reduce-scatter, then all-gather: rank k owns elements [begin(k), begin(k+1)), sums that
// chunk of every partial in rank order (reading peers directly), and every rank gathers
// the owners' chunks, so all end bit-identical.
Status TwoShot(Context& ctx, const Ranks& r) {
  DeviceBackend& b = ctx.backend();
  const size_t world = r.dev.size(), count = r.count;
  const bool bf16 = r.bf16, signs = r.signs;
  const float scale = r.scale;
  const std::vector<int>& dev = r.dev;
  const std::vector<char*>& buf = r.buf;
  const std::vector<Stream>& stream = r.stream;
  const size_t chunk = ((count + world - 1) / world + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  auto begin = [&](size_t k) { return std::min(count, k * chunk); };
  auto length = [&](size_t k) { return begin(k + 1) - begin(k); };

  StreamJoins joins(ctx);
  BorrowedScratch scratch(ctx.scratch());
  std::vector<void*> half(world, nullptr), sign(world, nullptr);
  Status s;
  // Phase 0: the partials as they travel (bf16 halves the bytes of the reduce-scatter).
  for (size_t k = 0; s.ok() && k < world; ++k) {
    if (bf16 && (s = scratch.Take(dev[k], count * 2, stream[k], &half[k])).ok()) {
      s = b.CastToBf16(dev[k], static_cast<uint16_t*>(half[k]), reinterpret_cast<const float*>(buf[k]), count,
                       stream[k]);
    }
    if (s.ok() && signs) s = scratch.Take(dev[k], chunk, stream[k], &sign[k]);
  }
  if (s.ok()) s = JoinAll(joins, dev, stream);
  // Phase 1: each owner sums its chunk of every partial in rank order.
  for (size_t k = 0; s.ok() && k < world; ++k) {
    if (length(k) == 0) continue;
    std::vector<const void*> partials(world);
    for (size_t j = 0; s.ok() && j < world; ++j) {
      const char* base = bf16 ? static_cast<const char*>(half[j]) + begin(k) * 2 : buf[j] + begin(k) * 4;
      s = Readable(ctx, dev[k], dev[j], base, length(k) * (bf16 ? 2 : 4), stream[k], &scratch, &partials[j]);
    }
    if (s.ok()) {
      s = b.ReduceSum(dev[k], signs ? sign[k] : buf[k] + begin(k) * 4, partials.data(), world, bf16, length(k), scale,
                      signs, stream[k]);
    }
  }
  if (s.ok()) s = JoinAll(joins, dev, stream);
  // Phase 2: every rank gathers the owners' chunks (bit-identical everywhere).
  for (size_t k = 0; s.ok() && k < world; ++k) {
    std::vector<CopyLeaf> pulled;
    for (size_t j = 0; s.ok() && j < world; ++j) {
      if (length(j) == 0 || (j == k && !signs)) continue;
      float* to = reinterpret_cast<float*>(buf[k] + begin(j) * 4);
      if (signs) {
        const void* from = nullptr;
        s = Readable(ctx, dev[k], dev[j], sign[j], length(j), stream[k], &scratch, &from);
        if (s.ok()) s = b.ExpandSigns(dev[k], to, static_cast<const int8_t*>(from), length(j), stream[k]);
      } else if (DirectlyReadable(ctx, dev[k], dev[j])) {
        pulled.push_back(CopyLeaf{buf[j] + begin(j) * 4, to, length(j) * 4});
      } else {
        const CopyLeaf leaf{buf[j] + begin(j) * 4, to, length(j) * 4};
        s = b.CopyLeaves(dev[k], dev[j], &leaf, 1, stream[k]);
      }
    }
    if (s.ok() && !pulled.empty()) s = b.PullLeaves(dev[k], pulled.data(), pulled.size(), stream[k]);
  }
  // Backward join: nobody touches a buffer or scratch block others still read.
  if (s.ok()) s = JoinAll(joins, dev, stream);
  Status released = scratch.GiveBack();
  QLINK_RETURN_IF_ERROR(s);
  return released;
}

// Recursive halving (reduce-scatter), then recursive doubling (all-gather), for a
// power-of-two number of ranks: log2(world) pairwise exchanges each way. In step d, rank k
// and k ^ d share a segment; each keeps one half and sums it with the partner's copy of
// that half (lower rank's value first), so every element ends owned by one rank; owners
// apply the scale or sign, then pairs swap their segments back until all hold everything.
Status HalvingDoubling(Context& ctx, const Ranks& r) {
  DeviceBackend& b = ctx.backend();
  const size_t world = r.dev.size();
  StreamJoins joins(ctx);
  BorrowedScratch scratch(ctx.scratch());
  std::vector<size_t> lo(world, 0), hi(world, r.count);  // each rank's segment, in elements
  // Every rank waits for its partner's work so far: its data is ready, its reads are done.
  auto join_pairs = [&](size_t d) -> Status {
    std::vector<Event> marks(world);
    for (size_t k = 0; k < world; ++k) QLINK_RETURN_IF_ERROR(joins.Record(r.dev[k], r.stream[k], &marks[k]));
    for (size_t k = 0; k < world; ++k) QLINK_RETURN_IF_ERROR(joins.Wait(r.dev[k], r.stream[k], marks[k ^ d]));
    return Status::Ok();
  };
  auto keep = [&](size_t ragged) { return (ragged + kChunkAlign - 1) / kChunkAlign * kChunkAlign; };
  Status s;
  for (size_t d = world / 2; s.ok() && d >= 1; d /= 2) {
    s = join_pairs(d);
    std::vector<size_t> next_lo(lo), next_hi(hi);
    for (size_t k = 0; s.ok() && k < world; ++k) {
      const size_t p = k ^ d, mid = std::min(hi[k], lo[k] + keep((hi[k] - lo[k]) / 2));
      next_lo[k] = (k & d) == 0 ? lo[k] : mid;
      next_hi[k] = (k & d) == 0 ? mid : hi[k];
      const size_t n = next_hi[k] - next_lo[k];
      if (n == 0) continue;
      const void* partials[2];
      const size_t first = std::min(k, p), second = std::max(k, p);
      s = Readable(ctx, r.dev[k], r.dev[first], r.buf[first] + next_lo[k] * 4, n * 4, r.stream[k], &scratch, &partials[0]);
      if (s.ok()) {
        s = Readable(ctx, r.dev[k], r.dev[second], r.buf[second] + next_lo[k] * 4, n * 4, r.stream[k], &scratch,
                     &partials[1]);
      }
      if (s.ok()) s = b.ReduceSum(r.dev[k], r.buf[k] + next_lo[k] * 4, partials, 2, false, n, 1.0f, false, r.stream[k]);
    }
    lo.swap(next_lo);
    hi.swap(next_hi);
  }
  // Owners finish their segment: the average's scale in place, or the sign as int8 into a
  // per-rank sign buffer, whose segments the doubling then gathers (a quarter of the bytes
  // of fp32) before each rank expands all of it.
  std::vector<char*> gathered(r.buf);  // what the doubling exchanges
  size_t element = 4;
  if (r.signs) {
    element = 1;
    for (size_t k = 0; s.ok() && k < world; ++k) {
      void* signs = nullptr;
      s = scratch.Take(r.dev[k], r.count, r.stream[k], &signs);
      gathered[k] = static_cast<char*>(signs);
    }
  }
  for (size_t k = 0; s.ok() && k < world && (r.signs || r.scale != 1.0f); ++k) {
    const size_t n = hi[k] - lo[k];
    if (n == 0) continue;
    const void* own = r.buf[k] + lo[k] * 4;
    s = b.ReduceSum(r.dev[k], gathered[k] + lo[k] * element, &own, 1, false, n, r.scale, r.signs, r.stream[k]);
  }
  for (size_t d = 1; s.ok() && d < world; d *= 2) {
    s = join_pairs(d);
    std::vector<size_t> next_lo(lo), next_hi(hi);
    for (size_t k = 0; s.ok() && k < world; ++k) {
      const size_t p = k ^ d, n = hi[p] - lo[p];
      next_lo[k] = std::min(lo[k], lo[p]);
      next_hi[k] = std::max(hi[k], hi[p]);
      if (n == 0) continue;
      const CopyLeaf leaf{gathered[p] + lo[p] * element, gathered[k] + lo[p] * element, n * element};
      s = DirectlyReadable(ctx, r.dev[k], r.dev[p]) ? b.PullLeaves(r.dev[k], &leaf, 1, r.stream[k])
                                                    : b.CopyLeaves(r.dev[k], r.dev[p], &leaf, 1, r.stream[k]);
    }
    lo.swap(next_lo);
    hi.swap(next_hi);
  }
  for (size_t k = 0; s.ok() && r.signs && k < world; ++k) {
    s = b.ExpandSigns(r.dev[k], reinterpret_cast<float*>(r.buf[k]), reinterpret_cast<const int8_t*>(gathered[k]),
                      r.count, r.stream[k]);
  }
  // Backward join: nobody touches a buffer or scratch block others still read.
  if (s.ok()) s = JoinAll(joins, r.dev, r.stream);
  Status released = scratch.GiveBack();
  QLINK_RETURN_IF_ERROR(s);
  return released;
}

}  // namespace

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
        return InvalidArgument(ArgName("destinations", r * leaves + i) + " is on device " + std::to_string(dev) +
                               (dev == root ? ", the root's" : ", not replica " + std::to_string(r) + "'s device " +
                                                                   std::to_string(replica_device[r])));
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
  qlink_copy_args whole{sizeof(qlink_copy_args), all_sources.data(), a->destinations, leaves * replicas,
                        a->streams, a->num_streams, flags};
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
    qlink_copy_args round{sizeof(qlink_copy_args), src.data(), dst.data(), src.size(), a->streams, a->num_streams,
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

Status Reduce(Context& ctx, const qlink_reduce_args* a) {
  if (a == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(a->struct_size, QLINK_REDUCE_ARGS_STRUCT_SIZE_1_1, "args", "1.1"));
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, a->streams, a->num_streams));
  uint64_t bytes = 0;
  std::vector<size_t> order;
  QLINK_RETURN_IF_ERROR(CheckPerDevice(ctx, a->inputs, a->num_inputs, "inputs", &bytes, &order));
  if (a->output == nullptr) return InvalidArgument("args.output is NULL");
  DeviceBackend& b = ctx.backend();
  uint64_t out_bytes = 0;
  QLINK_RETURN_IF_ERROR(CheckTensor(*a->output, "output", 0, b.device_type(), b.device_count(), &out_bytes));
  QLINK_RETURN_IF_ERROR(CheckFp32(*a->output, "output", 0));
  if (out_bytes != bytes) {
    return InvalidArgument("output has " + std::to_string(out_bytes) + " bytes but inputs[0] has " +
                           std::to_string(bytes));
  }
  const int o = a->output->device.device_id;
  const char* out = TensorBytes(*a->output);
  for (size_t i = 0; i < a->num_inputs; ++i) {
    const char* in = TensorBytes(a->inputs[i]);
    const bool in_place = in == out && a->inputs[i].device.device_id == o;
    if (!in_place && bytes > 0 && in < out + bytes && out < in + bytes) {
      return InvalidArgument("output overlaps " + ArgName("inputs", i) + " (only the input of the output's own device "
                             "may be the output itself)");
    }
  }
  if (!std::isfinite(a->scale)) return InvalidArgument("args.scale is not finite");
  if (bytes == 0) return Status::Ok();

  StreamJoins joins(ctx);
  Stream os = StreamFor(o, a->streams, a->num_streams);
  for (size_t i : order) {
    const int d = a->inputs[i].device.device_id;
    Stream ds = StreamFor(d, a->streams, a->num_streams);
    if (d == o || b.StreamIdle(d, ds)) continue;
    Event e = nullptr;
    QLINK_RETURN_IF_ERROR(joins.Record(d, ds, &e));
    QLINK_RETURN_IF_ERROR(joins.Wait(o, os, e));
  }
  BorrowedScratch staged(ctx.scratch());
  std::vector<const void*> partials;
  Status s;
  for (size_t k = 0; s.ok() && k < order.size(); ++k) {
    const DLTensor& in = a->inputs[order[k]];
    const void* p = nullptr;
    s = Readable(ctx, o, in.device.device_id, TensorBytes(in), bytes, os, &staged, &p);
    partials.push_back(p);
  }
  if (s.ok()) {
    s = b.ReduceSum(o, const_cast<char*>(out), partials.data(), partials.size(), false, bytes / 4,
                    static_cast<float>(a->scale), false, os);
  }
  Status released = staged.GiveBack();
  QLINK_RETURN_IF_ERROR(s);
  QLINK_RETURN_IF_ERROR(released);
  // Backward join: the partials may be reused on their streams once read.
  Event done = nullptr;
  QLINK_RETURN_IF_ERROR(joins.Record(o, os, &done));
  for (size_t i : order) {
    const int d = a->inputs[i].device.device_id;
    if (d != o) QLINK_RETURN_IF_ERROR(joins.Wait(d, StreamFor(d, a->streams, a->num_streams), done));
  }
  return Status::Ok();
}

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
  Ranks r;
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
  Ranks r = ranks_;
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
