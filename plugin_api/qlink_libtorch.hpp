// qlink for C++ hosts on LibTorch: at::Tensor in and out of the C ABI (qlink.h). Header
// only, so it compiles against whichever LibTorch the host builds with: tensors cross as
// DLTensors made from the tensor's own metadata (not at::toDLPack, whose struct changed
// between PyTorch releases), and libqlink.so is dlopen'ed, never linked.
//
//   qlink::libtorch::Library lib("/path/to/libqlink.so");
//   qlink::libtorch::Context ctx(lib, R"({"backend": "cuda"})");
//   auto h = ctx.hessian({x}, /*columns=*/4096);           // X^T X, (2/N) applied by the host
//   auto q = ctx.gptq_quantize(weight, h * (2.0 / rows));  // codes, scales, zeros, g_idx, weight
//   auto w = ctx.signround_qdq({{"q_proj", weight, v, min_scale, max_scale}}, {});  // ABI 1.7
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
      case at::kHalf:
        dl_.dtype.code = kDLFloat;
        break;
      case at::kBFloat16:
        dl_.dtype.code = kDLBfloat;
        break;
      case at::kByte:
        dl_.dtype.code = kDLUInt;
        break;
      case at::kInt:
        dl_.dtype.code = kDLInt;
        break;
      default:
        throw Error(QLINK_INVALID_ARGUMENT,
                    std::string("dtype ") + at::toString(t.scalar_type()) + " does not cross the qlink ABI");
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
  double nsamples = 0;           // 0: loss is the undivided sum
  bool act_group_aware = false;  // GPTQModel's group-aware reordering (ABI 1.5)
};

struct GptqResult {
  at::Tensor codes;   // uint8 (rows, columns)
  at::Tensor scales;  // fp32 (rows, groups)
  at::Tensor zeros;   // fp32 (rows, groups)
  at::Tensor g_idx;   // int32 (columns)
  at::Tensor weight;  // dequantized, the weight's dtype
  double loss = 0;
  double damp = 0;
};

// One layer of a multi-layer solve; `name` names it in errors.
struct GptqLayer {
  std::string name;
  at::Tensor weight;
  at::Tensor hessian;
};

// SignRound (ABI 1.7): the options of qlink_signround_options and one wrapped linear.
struct SignRoundOptions {
  int32_t bits = 4;
  int32_t group_size = 128;
  int32_t sym = 1;
  at::ScalarType scale_dtype = at::kHalf;
  double q_scale_thresh = 1e-5;
};

struct SignRoundLayer {
  std::string name;
  at::Tensor weight;     // (rows, columns)
  at::Tensor v;          // (groups, group_len) fp32
  at::Tensor min_scale;  // (groups,) fp32, clamped to [0, 1] in place by the forward
  at::Tensor max_scale;
};

struct SignRoundGrads {
  at::Tensor v, min_scale, max_scale;
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
    qlink_hessian_args args{
        QLINK_HESSIAN_ARGS_STRUCT_SIZE, in.data(), in.size(), out.data(), out.size(), nullptr, 0, precision};
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
    const qlink_gptq_options o{QLINK_GPTQ_OPTIONS_STRUCT_SIZE,
                               options.bits,
                               options.group_size,
                               options.sym,
                               options.desc_act,
                               options.static_groups,
                               options.tf32,
                               options.damp,
                               options.damp_auto_increment,
                               options.nsamples,
                               options.act_group_aware};
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
      for (auto [slot, t] : {std::pair<const DLTensor**, const at::Tensor*>{&s.weight, &w},
                             {&s.hessian, &layers[i].hessian},
                             {&s.codes, &r.codes},
                             {&s.scales, &r.scales},
                             {&s.zeros, &r.zeros},
                             {&s.g_idx, &r.g_idx},
                             {&s.dequantized, &r.weight}}) {
        *slot = views.emplace_back(*t).get();
      }
    }
    qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE,
                         &o,
                         specs.data(),
                         specs.size(),
                         devices.empty() ? nullptr : devices.data(),
                         devices.size(),
                         nullptr,
                         0};
    Check(api_.gptq_quantize(ctx_, &args));
    for (size_t i = 0; i < layers.size(); ++i) {
      results[i].loss = specs[i].loss;
      results[i].damp = specs[i].damp;
    }
    return results;
  }

  // Every layer's quant-dequant (AutoRound's WrapperLinear), in the weight's dtype.
  std::vector<at::Tensor> signround_qdq(const std::vector<SignRoundLayer>& layers, const SignRoundOptions& options) {
    std::vector<at::Tensor> out;
    for (const SignRoundLayer& l : layers) out.push_back(at::empty_like(l.weight));
    SignRound(
        layers, options,
        [&](size_t i, qlink_signround_layer& s, std::deque<View>& views) { s.qdq = views.emplace_back(out[i]).get(); },
        api_.signround_qdq);
    return out;
  }

  // The gradients of v, min_scale and max_scale from each layer's grad_qdq.
  std::vector<SignRoundGrads> signround_qdq_backward(const std::vector<SignRoundLayer>& layers,
                                                     const std::vector<at::Tensor>& grad_qdq,
                                                     const SignRoundOptions& options) {
    std::vector<SignRoundGrads> out;
    for (const SignRoundLayer& l : layers) {
      out.push_back({at::empty_like(l.v), at::empty_like(l.min_scale), at::empty_like(l.max_scale)});
    }
    SignRound(
        layers, options,
        [&](size_t i, qlink_signround_layer& s, std::deque<View>& views) {
          s.grad_qdq = views.emplace_back(grad_qdq.at(i)).get();
          s.grad_v = views.emplace_back(out[i].v).get();
          s.grad_min_scale = views.emplace_back(out[i].min_scale).get();
          s.grad_max_scale = views.emplace_back(out[i].max_scale).get();
        },
        api_.signround_qdq_backward);
    return out;
  }

 private:
  template <typename Outputs, typename Entry>
  void SignRound(const std::vector<SignRoundLayer>& layers, const SignRoundOptions& options, Outputs outputs,
                 Entry entry) {
    if (api_.abi_minor < 7) throw Error(QLINK_VERSION_MISMATCH, "SignRound needs libqlink ABI 1.7");
    DLDataType scale{kDLFloat, 32, 1};
    if (options.scale_dtype == at::kHalf) scale.bits = 16;
    if (options.scale_dtype == at::kBFloat16) scale = DLDataType{kDLBfloat, 16, 1};
    const qlink_signround_options o{QLINK_SIGNROUND_OPTIONS_STRUCT_SIZE,
                                    options.bits,
                                    options.group_size,
                                    options.sym,
                                    scale,
                                    options.q_scale_thresh};
    std::deque<View> views;
    std::vector<qlink_signround_layer> specs(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      qlink_signround_layer& s = specs[i];
      s.struct_size = QLINK_SIGNROUND_LAYER_STRUCT_SIZE;
      s.name = layers[i].name.empty() ? nullptr : layers[i].name.c_str();
      s.weight = views.emplace_back(layers[i].weight).get();
      s.v = views.emplace_back(layers[i].v).get();
      s.min_scale = views.emplace_back(layers[i].min_scale).get();
      s.max_scale = views.emplace_back(layers[i].max_scale).get();
      outputs(i, s, views);
    }
    const qlink_signround_args args{QLINK_SIGNROUND_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(), nullptr, 0};
    Check(entry(ctx_, &args));
  }

  void Check(qlink_status s) const {
    if (s != QLINK_OK) throw Error(s, api_.last_error());
  }

  const qlink_api& api_;
  qlink_context* ctx_ = nullptr;
};

}  // namespace libtorch
}  // namespace qlink
