// Test only: the slice of PyTorch's stable C shim the torch bridge looks up, over tensors
// in CPU memory that claim any device, so the bridge's own logic (leaf reading, ties,
// placement, handle ownership) runs where no PyTorch has the shim (CI's is 1.13). Every
// handle and storage is counted: a test ends by checking nothing is left alive.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace {

constexpr int32_t kCpu = 0, kCuda = 1, kStrided = 0;
constexpr int32_t kUint8 = 0;  // PyTorch's ScalarType numbering, as the real shim reports it

std::atomic<int64_t> live_handles{0}, live_storages{0};

struct Storage {
  explicit Storage(size_t n) : bytes(n), data(std::calloc(n > 0 ? n : 1, 1)) { ++live_storages; }
  ~Storage() {
    std::free(data);
    --live_storages;
  }
  size_t bytes;
  void* data;
};

struct Impl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // elements
  int32_t dtype = kUint8, device_type = kCpu, device_index = 0;
  std::vector<int64_t> sizes, strides;
};

// One handle: a reference to a tensor, as an at::Tensor* is in the real shim.
struct Ref {
  explicit Ref(std::shared_ptr<Impl> i) : impl(std::move(i)) { ++live_handles; }
  ~Ref() { --live_handles; }
  std::shared_ptr<Impl> impl;
};

size_t ElementSize(int32_t dtype) {
  static const size_t kSizes[] = {1, 1, 2, 4, 8, 2, 4, 8, 4, 8, 16, 1, 1, 1, 4, 2};  // ScalarType 0-15
  return dtype >= 0 && dtype < 16 ? kSizes[dtype] : 0;
}

Impl& Of(void* h) { return *static_cast<Ref*>(h)->impl; }

int64_t Numel(const Impl& t) {
  int64_t n = 1;
  for (int64_t s : t.sizes) n *= s;
  return n;
}

void* Make(std::shared_ptr<Storage> storage, int64_t offset, int32_t dtype, int32_t device_type, int32_t device_index,
           int64_t ndim, const int64_t* sizes, const int64_t* strides) {
  auto impl = std::make_shared<Impl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->device_type = device_type;
  impl->device_index = device_index;
  impl->sizes.assign(sizes, sizes + ndim);
  impl->strides.assign(strides, strides + ndim);
  return new Ref(std::move(impl));
}

}  // namespace

extern "C" {

int32_t aoti_torch_device_type_cpu() { return kCpu; }
int32_t aoti_torch_device_type_cuda() { return kCuda; }
int32_t aoti_torch_layout_strided() { return kStrided; }
int32_t aoti_torch_dtype_uint8() { return kUint8; }
size_t aoti_torch_dtype_element_size(int32_t dtype) { return ElementSize(dtype); }

int32_t aoti_torch_delete_tensor_object(void* h) {
  delete static_cast<Ref*>(h);
  return 0;
}
int32_t aoti_torch_new_tensor_handle(void* h, void** out) {
  *out = new Ref(static_cast<Ref*>(h)->impl);
  return 0;
}
int32_t aoti_torch_get_data_ptr(void* h, void** out) {
  const Impl& t = Of(h);
  *out = static_cast<char*>(t.storage->data) + t.offset * ElementSize(t.dtype);
  return 0;
}
int32_t aoti_torch_get_numel(void* h, int64_t* out) {
  *out = Numel(Of(h));
  return 0;
}
int32_t aoti_torch_get_dim(void* h, int64_t* out) {
  *out = static_cast<int64_t>(Of(h).sizes.size());
  return 0;
}
int32_t aoti_torch_get_sizes(void* h, int64_t** out) {
  *out = Of(h).sizes.data();
  return 0;
}
int32_t aoti_torch_get_strides(void* h, int64_t** out) {
  *out = Of(h).strides.data();
  return 0;
}
int32_t aoti_torch_get_dtype(void* h, int32_t* out) {
  *out = Of(h).dtype;
  return 0;
}
int32_t aoti_torch_get_device_type(void* h, int32_t* out) {
  *out = Of(h).device_type;
  return 0;
}
int32_t aoti_torch_get_device_index(void* h, int32_t* out) {
  *out = Of(h).device_index;
  return 0;
}
int32_t aoti_torch_get_layout(void*, int32_t* out) {
  *out = kStrided;
  return 0;
}
int32_t aoti_torch_is_contiguous(void* h, bool* out) {
  const Impl& t = Of(h);
  int64_t expected = 1;
  *out = true;
  for (size_t d = t.sizes.size(); d-- > 0;) {
    if (t.sizes[d] != 1 && t.strides[d] != expected) *out = false;
    expected *= t.sizes[d];
  }
  return 0;
}
int32_t aoti_torch_empty_strided(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype,
                                 int32_t device_type, int32_t device_index, void** out) {
  int64_t extent = 1;  // elements up to the last one addressed
  for (int64_t d = 0; d < ndim; ++d) {
    if (sizes[d] == 0) extent = 0;
    if (extent > 0) extent += (sizes[d] - 1) * strides[d];
  }
  *out = Make(std::make_shared<Storage>(extent * ElementSize(dtype)), 0, dtype, device_type, device_index, ndim, sizes,
              strides);
  return 0;
}
int32_t aoti_torch__alloc_from_pool(void* pool, int64_t offset_bytes, int32_t dtype, int64_t ndim, const int64_t* sizes,
                                    const int64_t* strides, void** out) {
  const Impl& p = Of(pool);
  if (p.offset != 0 || ElementSize(dtype) == 0 || offset_bytes % ElementSize(dtype) != 0) return 1;
  *out = Make(p.storage, offset_bytes / ElementSize(dtype), dtype, p.device_type, p.device_index, ndim, sizes, strides);
  return 0;
}
int32_t aoti_torch_get_current_cuda_stream(int32_t, void** out) {
  *out = nullptr;  // the default stream: what the CPU backend's virtual devices take
  return 0;
}

// For the tests: a tensor of its own storage (zeroed) or a view of another's, and the counts.
void* fake_tensor(int32_t device_type, int32_t device_index, int32_t dtype, int64_t ndim, const int64_t* sizes,
                  const int64_t* strides) {
  void* h = nullptr;
  aoti_torch_empty_strided(ndim, sizes, strides, dtype, device_type, device_index, &h);
  return h;
}
void* fake_view(void* base, int64_t offset, int64_t ndim, const int64_t* sizes, const int64_t* strides) {
  const Impl& b = Of(base);
  return Make(b.storage, offset, b.dtype, b.device_type, b.device_index, ndim, sizes, strides);
}
const void* fake_storage(void* h) { return Of(h).storage.get(); }
int64_t fake_live_handles() { return live_handles.load(); }
int64_t fake_live_storages() { return live_storages.load(); }

}  // extern "C"
