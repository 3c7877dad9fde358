#include "core/all_reduce_algorithms.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/collective_buffers.h"
#include "core/stream_joins.h"

namespace qlink {
namespace {

constexpr size_t kChunkAlign = 64;  // elements: owned chunks start 256-byte aligned

}  // namespace

Status OneShot(Context& ctx, const AllReduceRanks& r) {
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
Status TwoShot(Context& ctx, const AllReduceRanks& r) {
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
  // Phase 0: the partials as they travel (bf16 halves the bytes of the reduce-scatter).
  for (size_t k = 0; k < world; ++k) {
    if (bf16) {
      QLINK_RETURN_IF_ERROR(scratch.Take(dev[k], count * 2, stream[k], &half[k]));
      QLINK_RETURN_IF_ERROR(b.CastToBf16(dev[k], static_cast<uint16_t*>(half[k]),
                                         reinterpret_cast<const float*>(buf[k]), count, stream[k]));
    }
    if (signs) QLINK_RETURN_IF_ERROR(scratch.Take(dev[k], chunk, stream[k], &sign[k]));
  }
  QLINK_RETURN_IF_ERROR(joins.JoinAll(dev, stream));
  // Phase 1: each owner sums its chunk of every partial in rank order.
  for (size_t k = 0; k < world; ++k) {
    if (length(k) == 0) continue;
    std::vector<const void*> partials(world);
    for (size_t j = 0; j < world; ++j) {
      const char* base = bf16 ? static_cast<const char*>(half[j]) + begin(k) * 2 : buf[j] + begin(k) * 4;
      QLINK_RETURN_IF_ERROR(
          Readable(ctx, dev[k], dev[j], base, length(k) * (bf16 ? 2 : 4), stream[k], &scratch, &partials[j]));
    }
    QLINK_RETURN_IF_ERROR(b.ReduceSum(dev[k], signs ? sign[k] : buf[k] + begin(k) * 4, partials.data(), world, bf16,
                                      length(k), scale, signs, stream[k]));
  }
  QLINK_RETURN_IF_ERROR(joins.JoinAll(dev, stream));
  // Phase 2: every rank gathers the owners' chunks (bit-identical everywhere).
  for (size_t k = 0; k < world; ++k) {
    std::vector<CopyLeaf> pulled;
    for (size_t j = 0; j < world; ++j) {
      if (length(j) == 0 || (j == k && !signs)) continue;
      float* to = reinterpret_cast<float*>(buf[k] + begin(j) * 4);
      if (signs) {
        const void* from = nullptr;
        QLINK_RETURN_IF_ERROR(Readable(ctx, dev[k], dev[j], sign[j], length(j), stream[k], &scratch, &from));
        QLINK_RETURN_IF_ERROR(b.ExpandSigns(dev[k], to, static_cast<const int8_t*>(from), length(j), stream[k]));
      } else if (DirectlyReadable(ctx, dev[k], dev[j])) {
        pulled.push_back(CopyLeaf{buf[j] + begin(j) * 4, to, length(j) * 4});
      } else {
        const CopyLeaf leaf{buf[j] + begin(j) * 4, to, length(j) * 4};
        QLINK_RETURN_IF_ERROR(b.CopyLeaves(dev[k], dev[j], &leaf, 1, stream[k]));
      }
    }
    if (!pulled.empty()) QLINK_RETURN_IF_ERROR(b.PullLeaves(dev[k], pulled.data(), pulled.size(), stream[k]));
  }
  // Backward join: nobody touches a buffer or scratch block others still read.
  QLINK_RETURN_IF_ERROR(joins.JoinAll(dev, stream));
  return scratch.GiveBack();
}

// Recursive halving (reduce-scatter), then recursive doubling (all-gather), for a
// power-of-two number of ranks: log2(world) pairwise exchanges each way. In step d, rank k
// and k ^ d share a segment; each keeps one half and sums it with the partner's copy of
// that half (lower rank's value first), so every element ends owned by one rank; owners
// apply the scale or sign, then pairs swap their segments back until all hold everything.
Status HalvingDoubling(Context& ctx, const AllReduceRanks& r) {
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
  for (size_t d = world / 2; d >= 1; d /= 2) {
    QLINK_RETURN_IF_ERROR(join_pairs(d));
    std::vector<size_t> next_lo(lo), next_hi(hi);
    for (size_t k = 0; k < world; ++k) {
      const size_t p = k ^ d, mid = std::min(hi[k], lo[k] + keep((hi[k] - lo[k]) / 2));
      next_lo[k] = (k & d) == 0 ? lo[k] : mid;
      next_hi[k] = (k & d) == 0 ? mid : hi[k];
      const size_t n = next_hi[k] - next_lo[k];
      if (n == 0) continue;
      const void* partials[2];
      const size_t first = std::min(k, p), second = std::max(k, p);
      QLINK_RETURN_IF_ERROR(Readable(ctx, r.dev[k], r.dev[first], r.buf[first] + next_lo[k] * 4, n * 4, r.stream[k],
                                     &scratch, &partials[0]));
      QLINK_RETURN_IF_ERROR(Readable(ctx, r.dev[k], r.dev[second], r.buf[second] + next_lo[k] * 4, n * 4, r.stream[k],
                                     &scratch, &partials[1]));
      QLINK_RETURN_IF_ERROR(
          b.ReduceSum(r.dev[k], r.buf[k] + next_lo[k] * 4, partials, 2, false, n, 1.0f, false, r.stream[k]));
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
    for (size_t k = 0; k < world; ++k) {
      void* signs = nullptr;
      QLINK_RETURN_IF_ERROR(scratch.Take(r.dev[k], r.count, r.stream[k], &signs));
      gathered[k] = static_cast<char*>(signs);
    }
  }
  if (r.signs || r.scale != 1.0f) {
    for (size_t k = 0; k < world; ++k) {
      const size_t n = hi[k] - lo[k];
      if (n == 0) continue;
      const void* own = r.buf[k] + lo[k] * 4;
      QLINK_RETURN_IF_ERROR(
          b.ReduceSum(r.dev[k], gathered[k] + lo[k] * element, &own, 1, false, n, r.scale, r.signs, r.stream[k]));
    }
  }
  for (size_t d = 1; d < world; d *= 2) {
    QLINK_RETURN_IF_ERROR(join_pairs(d));
    std::vector<size_t> next_lo(lo), next_hi(hi);
    for (size_t k = 0; k < world; ++k) {
      const size_t p = k ^ d, n = hi[p] - lo[p];
      next_lo[k] = std::min(lo[k], lo[p]);
      next_hi[k] = std::max(hi[k], hi[p]);
      if (n == 0) continue;
      const CopyLeaf leaf{gathered[p] + lo[p] * element, gathered[k] + lo[p] * element, n * element};
      QLINK_RETURN_IF_ERROR(DirectlyReadable(ctx, r.dev[k], r.dev[p])
                                ? b.PullLeaves(r.dev[k], &leaf, 1, r.stream[k])
                                : b.CopyLeaves(r.dev[k], r.dev[p], &leaf, 1, r.stream[k]));
    }
    lo.swap(next_lo);
    hi.swap(next_hi);
  }
  if (r.signs) {
    for (size_t k = 0; k < world; ++k) {
      QLINK_RETURN_IF_ERROR(b.ExpandSigns(r.dev[k], reinterpret_cast<float*>(r.buf[k]),
                                          reinterpret_cast<const int8_t*>(gathered[k]), r.count, r.stream[k]));
    }
  }
  // Backward join: nobody touches a buffer or scratch block others still read.
  QLINK_RETURN_IF_ERROR(joins.JoinAll(r.dev, r.stream));
  return scratch.GiveBack();
}

}  // namespace qlink
