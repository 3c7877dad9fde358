#include "python/bridge/torch_shim.h"

#include <boost/dll/shared_library.hpp>

namespace qlink {
namespace bridge {
namespace {

const Shim* bound = nullptr;

template <typename F>
bool Find(const boost::dll::shared_library& lib, const char* name, F** out, std::string* error) {
  if (!lib.has(name)) {
    *error = lib.location().string() + " has no " + name;
    return false;
  }
  *out = &lib.get<F>(name);
  return true;
}

}  // namespace

bool BindShim(const char* cpu_library, const char* cuda_library, std::string* error) {
  if (bound != nullptr) return true;
  // PyTorch's own libraries, already loaded: these add references, never dropped, as the
  // functions found in them stay in use for the life of the process.
  static boost::dll::shared_library cpu, cuda;
  boost::dll::fs::error_code ec;
  cpu.load(cpu_library, boost::dll::load_mode::rtld_lazy, ec);
  if (ec) {
    *error = std::string("cannot open ") + cpu_library + ": " + ec.message();
    return false;
  }
  auto* s = new Shim{};
  int32_t (*cpu_type)() = nullptr, (*cuda_type)() = nullptr, (*strided)() = nullptr, (*uint8)() = nullptr;
  const bool ok =
      Find(cpu, "aoti_torch_delete_tensor_object", &s->delete_tensor_object, error) &&
      Find(cpu, "aoti_torch_get_data_ptr", &s->get_data_ptr, error) &&
      Find(cpu, "aoti_torch_get_numel", &s->get_numel, error) && Find(cpu, "aoti_torch_get_dim", &s->get_dim, error) &&
      Find(cpu, "aoti_torch_get_sizes", &s->get_sizes, error) &&
      Find(cpu, "aoti_torch_get_strides", &s->get_strides, error) &&
      Find(cpu, "aoti_torch_get_dtype", &s->get_dtype, error) &&
      Find(cpu, "aoti_torch_get_device_type", &s->get_device_type, error) &&
      Find(cpu, "aoti_torch_get_device_index", &s->get_device_index, error) &&
      Find(cpu, "aoti_torch_get_layout", &s->get_layout, error) &&
      Find(cpu, "aoti_torch_is_contiguous", &s->is_contiguous, error) &&
      Find(cpu, "aoti_torch_dtype_element_size", &s->dtype_element_size, error) &&
      Find(cpu, "aoti_torch_empty_strided", &s->empty_strided, error) &&
      Find(cpu, "aoti_torch__alloc_from_pool", &s->alloc_from_pool, error) &&
      Find(cpu, "aoti_torch_device_type_cpu", &cpu_type, error) &&
      Find(cpu, "aoti_torch_device_type_cuda", &cuda_type, error) &&
      Find(cpu, "aoti_torch_layout_strided", &strided, error) && Find(cpu, "aoti_torch_dtype_uint8", &uint8, error);
  if (!ok) {
    delete s;
    return false;
  }
  s->cpu = cpu_type();
  s->cuda = cuda_type();
  s->strided = strided();
  s->uint8 = uint8();
  if (cuda_library != nullptr) {
    cuda.load(cuda_library, boost::dll::load_mode::rtld_lazy, ec);
    if (!ec && cuda.has("aoti_torch_get_current_cuda_stream")) {
      s->get_current_cuda_stream = &cuda.get<ShimError(int32_t, void**)>("aoti_torch_get_current_cuda_stream");
    }
  }
  bound = s;
  return true;
}

const Shim& shim() { return *bound; }

Handles::~Handles() {
  for (Handle h : handles_) {
    if (h != nullptr) bound->delete_tensor_object(h);
  }
}

Handle Handles::Release(size_t i) {
  Handle h = handles_[i];
  handles_[i] = nullptr;
  return h;
}

Leaf Describe(Handle h) {
  const Shim& s = *bound;
  Leaf leaf{0, 0, -2, 0};
  int32_t type = 0, index = 0, dtype = 0, layout = 0;
  int64_t numel = 0;
  bool contiguous = false;
  void* data = nullptr;
  if (s.get_device_type(h, &type) || s.get_device_index(h, &index)) return leaf;
  leaf.device = type == s.cuda ? index : type == s.cpu ? -1 : -2;
  // A sparse or other non-strided leaf stays "not contiguous": the caller's exact path names it.
  if (s.get_layout(h, &layout) || layout != s.strided) return leaf;
  if (s.get_data_ptr(h, &data) || s.get_numel(h, &numel) || s.get_dtype(h, &dtype) || s.is_contiguous(h, &contiguous)) {
    return leaf;
  }
  leaf.data = reinterpret_cast<uint64_t>(data);
  leaf.nbytes = numel * static_cast<int64_t>(s.dtype_element_size(dtype));
  leaf.flags = contiguous ? kContiguous : 0;
  return leaf;
}

}  // namespace bridge
}  // namespace qlink
