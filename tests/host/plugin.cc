#include "tests/host/plugin.h"

#include <stdexcept>

namespace qlink_test {

Plugin::Plugin() {
  library_.load(RunfilePath("libqlink.so"), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  get_api_ = library_.get<const qlink_api*(uint32_t, uint32_t, const char**)>("qlink_get_api");
  const char* error = nullptr;
  api_ = get_api_(QLINK_ABI_MAJOR, QLINK_ABI_MINOR, &error);
  if (api_ == nullptr) throw std::runtime_error(std::string("ABI negotiation failed: ") + error);
}

Context::Context(const Plugin& plugin, const std::string& config_json) : api_(plugin.api()) {
  status_ = api_.context_create(config_json.c_str(), &ctx_);
}

Context::~Context() { api_.context_destroy(ctx_); }

Tensor::Tensor(void* data, int64_t bytes, DLDeviceType type, int device, DLDataType dtype) {
  const int64_t element = dtype.bits * dtype.lanes / 8;
  shape = bytes / element;
  dl = DLTensor{data, DLDevice{type, device}, 1, dtype, &shape, nullptr, 0};
}

}  // namespace qlink_test
