// docs/BASELINES.md's fastest raw path for small leaves (one kernel on the destination pulling
// every leaf, descriptors already in device memory, as p2p_bench.cu launches it), callable
// from Python through ctypes. copy_bench.py times it exactly as it times qlink, which
// separates the cost of calling from Python from the cost of qlink.
//   nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC -o raw_pull.so bench/raw_pull.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

struct Leaf {
  const int4* src;
  int4* dst;
  size_t vectors;  // 16-byte units
};

__global__ void PullLeaves(const Leaf* leaves, int count) {
  for (int l = blockIdx.y; l < count; l += gridDim.y) {
    const Leaf leaf = leaves[l];
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < leaf.vectors;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
      leaf.dst[i] = leaf.src[i];
    }
  }
}

}  // namespace

extern "C" {

// Uploads the descriptors of `count` leaves of `bytes` each (a multiple of 16) to the
// current device; returns the table, or NULL on failure.
void* raw_pull_table(const uint64_t* src, const uint64_t* dst, uint64_t bytes, int count) {
  std::vector<Leaf> host(count);
  for (int i = 0; i < count; ++i) {
    host[i] = {reinterpret_cast<const int4*>(src[i]), reinterpret_cast<int4*>(dst[i]), bytes / 16};
  }
  void* table = nullptr;
  if (cudaMalloc(&table, sizeof(Leaf) * count) != cudaSuccess) return nullptr;
  if (cudaMemcpy(table, host.data(), sizeof(Leaf) * count, cudaMemcpyHostToDevice) != cudaSuccess) return nullptr;
  return table;
}

// One launch on `stream` of the current device, with p2p_bench.cu's grid for this shape.
int raw_pull_launch(const void* table, int count, uint64_t bytes, void* stream) {
  const int gx = std::max(1, static_cast<int>(std::min<uint64_t>(1024, bytes / 16 / 256 / 4 + 1)));
  PullLeaves<<<dim3(gx, std::min(count, 65535)), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const Leaf*>(table), count);
  return static_cast<int>(cudaGetLastError());
}

void raw_pull_free(void* table) { cudaFree(table); }

}  // extern "C"
