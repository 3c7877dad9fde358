// PyTorch's stable C shim (torch/csrc/inductor/aoti_torch/c/shim.h: the ABI AOTInductor
// models and stable-ABI extensions are built against), looked up at run time in the
// process's own libtorch: no PyTorch headers at build time, one binary for every
// PyTorch from 2.3 on.
#ifndef QLINK_PYTHON_BRIDGE_TORCH_SHIM_H_
#define QLINK_PYTHON_BRIDGE_TORCH_SHIM_H_

#include <cstdint>
#include <string>
#include <vector>

namespace qlink {
namespace bridge {

using Handle = void*;       // AtenTensorHandle: one reference to a tensor
using ShimError = int32_t;  // AOTITorchError: 0 is success

// The shim functions used here, as shim.h declares them.
struct Shim {
  ShimError (*delete_tensor_object)(Handle);
  ShimError (*get_data_ptr)(Handle, void**);
  ShimError (*get_numel)(Handle, int64_t*);
  ShimError (*get_dim)(Handle, int64_t*);
  ShimError (*get_sizes)(Handle, int64_t**);
  ShimError (*get_strides)(Handle, int64_t**);
  ShimError (*get_dtype)(Handle, int32_t*);
  ShimError (*get_device_type)(Handle, int32_t*);
  ShimError (*get_device_index)(Handle, int32_t*);
  ShimError (*get_layout)(Handle, int32_t*);
  ShimError (*is_contiguous)(Handle, bool*);
  size_t (*dtype_element_size)(int32_t);
  ShimError (*empty_strided)(int64_t, const int64_t*, const int64_t*, int32_t, int32_t, int32_t, Handle*);
  ShimError (*alloc_from_pool)(Handle, int64_t, int32_t, int64_t, const int64_t*, const int64_t*, Handle*);
  ShimError (*get_current_cuda_stream)(int32_t, void**);  // libtorch_cuda's; null without it
  int32_t cpu, cuda, strided, uint8;                      // device types, layout and dtype as this PyTorch numbers them
};

// Looks the shim up in libtorch_cpu (and the current stream in libtorch_cuda, if given);
// false with *error set when a function is missing. The first success stays for the
// life of the process.
bool BindShim(const char* cpu_library, const char* cuda_library, std::string* error);
const Shim& shim();  // after a successful BindShim

// Handles owned here, released on destruction unless handed out with Release().
class Handles {
 public:
  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles();
  void Add(Handle h) { handles_.push_back(h); }
  void Set(size_t i, Handle h) { handles_[i] = h; }  // slot i must be empty
  Handle operator[](size_t i) const { return handles_[i]; }
  size_t size() const { return handles_.size(); }
  Handle Release(size_t i);

 private:
  std::vector<Handle> handles_;
};

// One leaf as the bridge reports it (qlink/_bridge.py mirrors the layout).
struct Leaf {
  uint64_t data;
  int64_t nbytes;
  int32_t device;  // index on the GPU, -1 on the host, -2 elsewhere (meta, xpu, ...)
  uint32_t flags;  // kContiguous: a strided tensor laid out compactly
};
constexpr uint32_t kContiguous = 1;

Leaf Describe(Handle h);

}  // namespace bridge
}  // namespace qlink

#endif  // QLINK_PYTHON_BRIDGE_TORCH_SHIM_H_
