// Pulls a batch of leaves with one launch on the destination device, reading the sources
// straight over the peer link. Descriptors travel in the kernel's parameter space (up to
// 32 KiB since CUDA 12.1), so no host-to-device copy precedes the launch; a prepared
// batch keeps one descriptor per chunk in device memory instead, written once, so each
// block finds its bytes with a single load rather than a search through the leaves.
#include "backends/gpu/pull_kernel.h"

#include "backends/gpu/gpu_device.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace qlink {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;               // 16-byte loads in flight per thread: peer reads are latency bound
constexpr uint32_t kMinChunkShift = 12;  // 4 KiB: one 16-byte vector per thread
constexpr uint32_t kMaxChunkShift = 16;  // 64 KiB
constexpr int kBlocksPerSm = 2048 / kThreads;
constexpr uint64_t kMaxTableChunks = uint64_t{1} << 16;  // bounds a prepared table (1.5 MiB)

struct LeafDesc {
  const char* src;
  char* dst;
  uint64_t bytes;
  uint64_t first_chunk;  // prefix sum of chunks before this leaf
};

struct BatchHeader {
  uint32_t count;
  uint32_t chunk_shift;  // chunk = 1 << chunk_shift bytes
  uint64_t total_chunks;
};

template <int kCapacity>
struct Batch {
  BatchHeader header;
  LeafDesc leaves[kCapacity];
};

__device__ void CopyBytes(const char* src, char* dst, uint64_t n) {
  for (uint64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
}

__device__ void CopyVectors(const int4* s, int4* d, uint64_t vectors) {
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < vectors; i += kUnroll * kThreads) {
    int4 v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = s[i + k * kThreads];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) d[i + k * kThreads] = v[k];
  }
  for (; i < vectors; i += kThreads) d[i] = s[i];
}

__device__ __forceinline__ void CopyChunk(const char* src, char* dst, uint64_t n) {
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) != 0) {
    CopyBytes(src, dst, n);  // unaligned views: correct, not fast
    return;
  }
  const uint64_t vectors = n / 16;
  CopyVectors(reinterpret_cast<const int4*>(src), reinterpret_cast<int4*>(dst), vectors);
  CopyBytes(src + vectors * 16, dst + vectors * 16, n - vectors * 16);
}

template <int kCapacity>
__global__ void __launch_bounds__(kThreads) PullKernel(const QLINK_GRID_CONSTANT Batch<kCapacity> batch) {
  const LeafDesc* leaves = batch.leaves;
  for (uint64_t chunk = blockIdx.x; chunk < batch.header.total_chunks; chunk += gridDim.x) {
    // The leaf owning this chunk: last leaf whose first_chunk <= chunk (uniform per block).
    uint32_t lo = 0, hi = batch.header.count - 1;
    while (lo < hi) {
      uint32_t mid = (lo + hi + 1) / 2;
      if (leaves[mid].first_chunk <= chunk)
        lo = mid;
      else
        hi = mid - 1;
    }
    const LeafDesc& leaf = leaves[lo];
    const uint64_t begin = (chunk - leaf.first_chunk) << batch.header.chunk_shift;
    CopyChunk(leaf.src + begin, leaf.dst + begin, min(uint64_t{1} << batch.header.chunk_shift, leaf.bytes - begin));
  }
}

// A prepared batch's unit of work: one block step's bytes within one leaf.
struct ChunkDesc {
  const char* src;
  char* dst;
  uint64_t bytes;
};

__global__ void __launch_bounds__(kThreads) PullTableKernel(const ChunkDesc* chunks, uint64_t count) {
  for (uint64_t c = blockIdx.x; c < count; c += gridDim.x) {
    const ChunkDesc chunk = chunks[c];
    CopyChunk(chunk.src, chunk.dst, chunk.bytes);
  }
}

// Chunks sized so the batch fills about one wave of blocks: small batches still spread
// over many SMs, large ones move 64 KiB per block step.
uint32_t ChunkShift(uint64_t total_bytes, int sm_count) {
  const uint64_t per_block = total_bytes / (uint64_t(sm_count) * kBlocksPerSm);
  uint32_t shift = kMinChunkShift;
  while (shift < kMaxChunkShift && (uint64_t{1} << shift) < per_block) ++shift;
  return shift;
}

uint64_t ChunksOf(uint64_t bytes, uint32_t shift) { return (bytes + (uint64_t{1} << shift) - 1) >> shift; }

uint64_t TotalBytes(const CopyLeaf* leaves, size_t count) {
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += leaves[i].bytes;
  return total;
}

unsigned GridFor(uint64_t chunks, int sm_count) {
  return static_cast<unsigned>(std::max<uint64_t>(1, std::min(chunks, uint64_t(sm_count) * kBlocksPerSm)));
}

// Fills a batch's header and descriptors; returns the grid to launch it with.
unsigned Describe(const CopyLeaf* leaves, size_t count, int sm_count, BatchHeader* header, LeafDesc* descs) {
  header->count = static_cast<uint32_t>(count);
  header->chunk_shift = ChunkShift(TotalBytes(leaves, count), sm_count);
  uint64_t chunks = 0;
  for (size_t i = 0; i < count; ++i) {
    descs[i] =
        LeafDesc{static_cast<const char*>(leaves[i].src), static_cast<char*>(leaves[i].dst), leaves[i].bytes, chunks};
    chunks += ChunksOf(leaves[i].bytes, header->chunk_shift);
  }
  header->total_chunks = chunks;
  return GridFor(chunks, sm_count);
}

// Parameter space grows with the capacity; small batches take a small instantiation.
template <int kCapacity>
gpuError_t Launch(const CopyLeaf* leaves, size_t count, int sm_count, gpuStream_t stream) {
  Batch<kCapacity> batch;
  const unsigned grid = Describe(leaves, count, sm_count, &batch.header, batch.leaves);
  PullKernel<kCapacity><<<grid, kThreads, 0, stream>>>(batch);
  return gpuGetLastError();
}

}  // namespace

gpuError_t LaunchPullLeaves(const CopyLeaf* leaves, size_t count, int sm_count, gpuStream_t stream) {
  while (count > 0) {
    const size_t n = std::min(count, kMaxLeavesPerLaunch);
    gpuError_t e;
    if (n <= 16) {
      e = Launch<16>(leaves, n, sm_count, stream);
#if defined(QLINK_GPU_HIP)  // n <= kMaxLeavesPerLaunch = 64
    } else {
      e = Launch<64>(leaves, n, sm_count, stream);
    }
#else
    } else if (n <= 64) {
      e = Launch<64>(leaves, n, sm_count, stream);
    } else if (n <= 256) {
      e = Launch<256>(leaves, n, sm_count, stream);
    } else {
      e = Launch<kMaxLeavesPerLaunch>(leaves, n, sm_count, stream);
    }
#endif
    if (e != gpuSuccess) return e;
    leaves += n;
    count -= n;
  }
  return gpuSuccess;
}

unsigned DescribePullTable(const CopyLeaf* leaves, size_t count, int sm_count, std::vector<char>* table) {
  const auto chunks_of = [&](uint32_t shift) {
    uint64_t chunks = 0;
    for (size_t i = 0; i < count; ++i) chunks += ChunksOf(leaves[i].bytes, shift);
    return chunks;
  };
  uint32_t shift = ChunkShift(TotalBytes(leaves, count), sm_count);
  uint64_t chunks = chunks_of(shift);
  while (chunks > kMaxTableChunks) chunks = chunks_of(++shift);
  table->resize(chunks * sizeof(ChunkDesc));
  auto* out = reinterpret_cast<ChunkDesc*>(table->data());
  for (size_t i = 0; i < count; ++i) {
    const auto* src = static_cast<const char*>(leaves[i].src);
    auto* dst = static_cast<char*>(leaves[i].dst);
    for (uint64_t begin = 0; begin < leaves[i].bytes; begin += uint64_t{1} << shift) {
      *out++ = ChunkDesc{src + begin, dst + begin, std::min(uint64_t{1} << shift, leaves[i].bytes - begin)};
    }
  }
  return GridFor(chunks, sm_count);
}

gpuError_t LaunchPullTable(const void* device_table, size_t table_bytes, unsigned grid, gpuStream_t stream) {
  PullTableKernel<<<grid, kThreads, 0, stream>>>(static_cast<const ChunkDesc*>(device_table),
                                                 table_bytes / sizeof(ChunkDesc));
  return gpuGetLastError();
}

}  // namespace gpu
}  // namespace qlink
