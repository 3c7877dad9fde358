// Test host side: loads the built libqlink.so with Boost.DLL (never linked to it), the
// way GPTQModel or AutoRound would dlopen it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/dll/shared_library.hpp>

#include "plugin_api/qlink.h"
#include "tests/host/runfiles.h"

namespace qlink_test {

class Plugin {
 public:
  // Loads libqlink.so from the runfiles and negotiates ABI 1.0.
  Plugin();
  const qlink_api& api() const { return *api_; }
  qlink_get_api_fn get_api() const { return get_api_; }

 private:
  boost::dll::shared_library library_;
  qlink_get_api_fn get_api_ = nullptr;
  const qlink_api* api_ = nullptr;
};

// A context owned by a test; destroyed with it.
class Context {
 public:
  Context(const Plugin& plugin, const std::string& config_json);
  ~Context();
  qlink_context* get() const { return ctx_; }
  qlink_status status() const { return status_; }

 private:
  const qlink_api& api_;
  qlink_context* ctx_ = nullptr;
  qlink_status status_;
};

// A contiguous 1-D tensor over `data` of `bytes` bytes on `device`.
// Not copyable: dl.shape points into the object (keep them in a std::deque).
struct Tensor {
  Tensor(void* data, int64_t bytes, DLDeviceType type, int device, DLDataType dtype = {kDLUInt, 8, 1});
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  DLTensor dl;
  int64_t shape;
};

}  // namespace qlink_test
