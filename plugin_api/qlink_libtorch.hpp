// qlink for C++ hosts on LibTorch: at::Tensor in and out of the C ABI (qlink.h). Header
// only, so it compiles against whichever LibTorch the host builds with: tensors cross as
// DLTensors made from the tensor's own metadata (not at::toDLPack, whose struct changed
// between PyTorch releases), and libqlink.so is dlopen'ed, never linked.
//
//   qlink::libtorch::Library lib("/path/to/libqlink.so");
//   qlink::libtorch::Context ctx(lib, R"({"backend": "cuda"})");
//   auto h = ctx.hessian({x}, /*columns=*/4096);           // X^T X, (2/N) applied by the host
//   auto q = ctx.gptq_quantize(weight, h * (2.0 / rows));  // codes, scales, zeros, g_idx, weight
//
// Errors throw qlink::libtorch::Error with qlink's message (which names the argument).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "qlink.h"

namespace qlink {
namespace libtorch {

class Error : public std::runtime_error {
 public:
  Error(qlink_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  qlink_status status() const { return status_; }

 private:
  qlink_status status_;
};

// libqlink.so, loaded for the life of the object; ABI 1.4 or later.
class Library {
 public:
  explicit Library(const std::string& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) throw Error(QLINK_UNAVAILABLE, std::string("cannot load ") + path + ": " + dlerror());
    void* symbol = dlsym(handle_, "qlink_get_api");
    if (symbol == nullptr) throw Error(QLINK_UNAVAILABLE, path + " exports no qlink_get_api");
    const char* why = nullptr;
    api_ = reinterpret_cast<qlink_get_api_fn>(symbol)(QLINK_ABI_MAJOR, 4, &why);
    if (api_ == nullptr) throw Error(QLINK_VERSION_MISMATCH, why != nullptr ? why : "ABI mismatch");
  }
  ~Library() { dlclose(handle_); }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  const qlink_api& api() const { return *api_; }

 private:
  void* handle_ = nullptr;
  const qlink_api* api_ = nullptr;
};

// A DLTensor viewing a tensor (borrowed: valid while the tensor and this object live).
class View {
 public:
  explicit View(const at::Tensor& t) : shape_(t.sizes().begin(), t.sizes().end()) {
    dl_.data = t.data_ptr();
    dl_.device.device_type = t.is_cuda() ? kDLCUDA : kDLCPU;  // ROCm builds of PyTorch report cuda too
    dl_.device.device_id = t.is_cuda() ? static_cast<int32_t>(t.get_device()) : 0;
    dl_.ndim = static_cast<int32_t>(shape_.size());
    dl_.dtype.lanes = 1;
    dl_.dtype.bits = static_cast<uint8_t>(t.element_size() * 8);
    switch (t.scalar_type()) {
      case at::kFloat:
      case at::kHalf: dl_.dtype.code = kDLFloat; break;
      case at::kBFloat16: dl_.dtype.code = kDLBfloat; break;
      case at::kByte: dl_.dtype.code = kDLUInt; break;
      case at::kInt: dl_.dtype.code = kDLInt; break;
      default: throw Error(QLINK_INVALID_ARGUMENT, std::string("dtype ") + at::toString(t.scalar_type()) +
                                                       " does not cross the qlink ABI");
    }
    if (!t.is_contiguous()) throw Error(QLINK_INVALID_ARGUMENT, "a tensor handed to qlink is not contiguous");
    dl_.shape = shape_.data();
    dl_.strides = nullptr;
    dl_.byte_offset = 0;
  }
  View(const View&) = delete;
  View& operator=(const View&) = delete;  // dl_.shape points into the object
  const DLTensor* get() const { return &dl_; }

 private:
  std::vector<int64_t> shape_;
  DLTensor dl_{};
};

struct GptqOptions {
  int bits = 4;
  int group_size = 128;  // -1: one group per row
  bool sym = true;
  bool desc_act = false;
  bool static_groups = false;
  bool tf32 = false;
  double damp = 0.01;
  double damp_auto_increment = 0.01;
  double nsamples = 0;  // 0: loss is the undivided sum
  bool act_group_aware = false;  // GPTQModel's group-aware reordering (ABI 1.5)
};

struct GptqResult {
  at::Tensor codes;    // uint8 (rows, columns)
  at::Tensor scales;   // fp32 (rows, groups)
  at::Tensor zeros;    // fp32 (rows, groups)
  at::Tensor g_idx;    // int32 (columns)
  at::Tensor weight;   // dequantized, the weight's dtype
  double loss = 0;
  double damp = 0;
};

// One layer of a multi-layer solve; `name` names it in errors.
struct GptqLayer {
  std::string name;
  at::Tensor weight;
  at::Tensor hessian;
};

class Context {
 public:
  Context(const Library& library, const std::string& config_json) : api_(library.api()) {
    Check(api_.context_create(config_json.c_str(), &ctx_));
  }
  ~Context() { api_.context_destroy(ctx_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  qlink_context* get() const { return ctx_; }

  // partials[d] += X^T X for every input on partials[d]'s device (fp32, both triangles),
  // summed as `precision` says (qlink_hessian_precision; DEFAULT: the config's).
  void hessian_accumulate(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& partials,
                          qlink_hessian_precision precision = QLINK_HESSIAN_PRECISION_DEFAULT) {
    std::deque<View> in_views, out_views;  // a deque: views never move
    std::vector<DLTensor> in, out;
    for (const at::Tensor& x : inputs) in.push_back(*in_views.emplace_back(x).get());
    for (const at::Tensor& p : partials) out.push_back(*out_views.emplace_back(p).get());
    qlink_hessian_args args{QLINK_HESSIAN_ARGS_STRUCT_SIZE, in.data(), in.size(), out.data(), out.size(),
                            nullptr, 0, precision};
    Check(api_.hessian_accumulate(ctx_, &args));
  }

  // X^T X of the activations (..., columns), all on one device.
  at::Tensor hessian(const std::vector<at::Tensor>& inputs, int64_t columns,
                     qlink_hessian_precision precision = QLINK_HESSIAN_PRECISION_DEFAULT) {
    at::Tensor h = at::zeros({columns, columns}, inputs.at(0).options().dtype(at::kFloat));
    hessian_accumulate(inputs, {h}, precision);
    return h;
  }

  GptqResult gptq_quantize(const at::Tensor& weight, const at::Tensor& hessian, const GptqOptions& options = {}) {
    return gptq_quantize({GptqLayer{"", weight, hessian}}, options, {}).at(0);
  }

  // Layers solved together, data-parallel over `devices` (empty: each on its own device).
  std::vector<GptqResult> gptq_quantize(const std::vector<GptqLayer>& layers, const GptqOptions& options,
                                        const std::vector<int32_t>& devices) {
    const qlink_gptq_options o{QLINK_GPTQ_OPTIONS_STRUCT_SIZE, options.bits, options.group_size, options.sym,
                               options.desc_act, options.static_groups, options.tf32, options.damp,
                               options.damp_auto_increment, options.nsamples, options.act_group_aware};
    std::vector<GptqResult> results(layers.size());
    std::deque<View> views;
    std::vector<qlink_gptq_layer> specs(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      const at::Tensor& w = layers[i].weight;
      const int64_t rows = w.size(0), cols = w.size(1);
      const int64_t groups = options.group_size > 0 && cols % options.group_size == 0 ? cols / options.group_size : 1;
      GptqResult& r = results[i];
      r.codes = at::empty({rows, cols}, w.options().dtype(at::kByte));
      r.scales = at::empty({rows, groups}, w.options().dtype(at::kFloat));
      r.zeros = at::empty({rows, groups}, w.options().dtype(at::kFloat));
      r.g_idx = at::empty({cols}, w.options().dtype(at::kInt));
      r.weight = at::empty_like(w);
      qlink_gptq_layer& s = specs[i];
      s.struct_size = QLINK_GPTQ_LAYER_STRUCT_SIZE;
      s.name = layers[i].name.empty() ? nullptr : layers[i].name.c_str();
      for (auto [slot, t] : {std::pair<const DLTensor**, const at::Tensor*>{&s.weight, &w}, {&s.hessian, &layers[i].hessian},
                             {&s.codes, &r.codes}, {&s.scales, &r.scales}, {&s.zeros, &r.zeros},
                             {&s.g_idx, &r.g_idx}, {&s.dequantized, &r.weight}}) {
        *slot = views.emplace_back(*t).get();
      }
    }
    qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(),
                         devices.empty() ? nullptr : devices.data(), devices.size(), nullptr, 0};
    Check(api_.gptq_quantize(ctx_, &args));
    for (size_t i = 0; i < layers.size(); ++i) {
      results[i].loss = specs[i].loss;
      results[i].damp = specs[i].damp;
    }
    return results;
  }

 private:
  void Check(qlink_status s) const {
    if (s != QLINK_OK) throw Error(s, api_.last_error());
  }

  const qlink_api& api_;
  qlink_context* ctx_ = nullptr;
};

}  // namespace libtorch
}  // namespace qlink
