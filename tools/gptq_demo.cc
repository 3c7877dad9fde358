#include "tools/gptq_demo.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kLayers = 2, kHidden = 256, kIntermediate = 704, kTokens = 1024;

void Check(const qlink_api& api, qlink_status s, const char* what) {
  if (s == QLINK_OK) return;
  std::fprintf(stderr, "qlink demo: %s failed (status %d): %s\n", what, static_cast<int>(s), api.last_error());
  std::exit(1);
}

// A 2-D fp32/uint8/int32 tensor in device memory, with its host copy.
struct Buffer {
  Buffer(const qlink_api& api, qlink_context* ctx, DLDevice device, int64_t rows, int64_t cols, DLDataType dtype)
      : api(api), ctx(ctx), shape{rows, cols}, bytes(static_cast<size_t>(rows * cols * dtype.bits / 8)) {
    Check(api, api.memory_allocate(ctx, device.device_id, bytes, &data), "memory_allocate");
    dl = DLTensor{data, device, 2, dtype, shape, nullptr, 0};
  }
  ~Buffer() { api.memory_free(ctx, dl.device.device_id, data); }
  Buffer(const Buffer&) = delete;
  void Upload(const void* host) {
    Check(api, api.memory_from_host(ctx, dl.device.device_id, data, host, bytes), "upload");
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> out(bytes / sizeof(T));
    Check(api, api.memory_to_host(ctx, dl.device.device_id, out.data(), data, bytes), "download");
    return out;
  }
  const qlink_api& api;
  qlink_context* ctx;
  int64_t shape[2];
  size_t bytes;
  void* data = nullptr;
  DLTensor dl;
};

// One linear: its weight, the outputs of a solve, and which activations feed it.
struct Linear {
  std::string name;
  int input;  // index of its activations / Hessian
  int64_t rows, cols;
  std::vector<float> w;
};

// Correlated activations (a low-rank mix plus noise), as a model's inputs to a linear are.
std::vector<float> Activations(int64_t tokens, int64_t d, std::mt19937& gen) {
  std::normal_distribution<float> normal;
  const int64_t rank = d / 8;
  std::vector<float> basis(static_cast<size_t>(rank * d)), x(static_cast<size_t>(tokens * d));
  for (float& v : basis) v = normal(gen);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> z(static_cast<size_t>(rank));
    for (float& v : z) v = normal(gen);
    for (int64_t c = 0; c < d; ++c) {
      float s = 0.3f * normal(gen);
      for (int64_t k = 0; k < rank; ++k) s += z[k] * basis[k * d + c];
      x[t * d + c] = s;
    }
  }
  return x;
}

// Mean squared output error of the quantized weight on the activations: |X (Wq - W)^T|^2.
double OutputError(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& wq, int64_t rows,
                   int64_t cols) {
  double total = 0;
  for (int64_t t = 0; t < kTokens; t += 8) {  // every eighth token is plenty
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += double(x[t * cols + c]) * (wq[r * cols + c] - w[r * cols + c]);
      total += s * s;
    }
  }
  return total;
}

}  // namespace

int GptqDemo(const qlink_api& api, qlink_context* ctx) {
  int32_t n = 0;
  Check(api, api.device_count(ctx, &n), "device_count");
  qlink_device_info info{};
  info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
  Check(api, api.device_info(ctx, 0, &info), "device_info");
  auto on = [&](int device) { return DLDevice{info.device.device_type, device}; };
  std::mt19937 gen(2026);
  std::normal_distribution<float> normal(0.0f, 0.02f);

  // Per decoder layer, the inputs of q/k/v, o, gate/up and down, each a Hessian.
  std::vector<std::vector<float>> x;
  std::vector<Linear> linears;
  for (int l = 0; l < kLayers; ++l) {
    const int base = static_cast<int>(x.size());
    for (int64_t d : {kHidden, kHidden, kHidden, kIntermediate}) x.push_back(Activations(kTokens, d, gen));
    const struct {
      const char* name;
      int input;
      int64_t rows, cols;
    } shapes[] = {{"q_proj", 0, kHidden, kHidden},          {"k_proj", 0, kHidden, kHidden},
                  {"v_proj", 0, kHidden, kHidden},          {"o_proj", 1, kHidden, kHidden},
                  {"gate_proj", 2, kIntermediate, kHidden}, {"up_proj", 2, kIntermediate, kHidden},
                  {"down_proj", 3, kHidden, kIntermediate}};
    for (const auto& s : shapes) {
      Linear lin{"layers." + std::to_string(l) + "." + s.name, base + s.input, s.rows, s.cols, {}};
      lin.w.resize(static_cast<size_t>(s.rows * s.cols));
      for (float& v : lin.w) v = normal(gen);
      linears.push_back(lin);
    }
  }

  // Hessians: each device holds its shard of every input's tokens (uploaded once) and
  // accumulates it; qlink merges the partials in device order on device 0 with the 2/N scale.
  struct Input {
    int64_t d;
    std::deque<Buffer> shards, partials;
    std::vector<DLTensor> in, parts;
  };
  std::deque<Input> inputs;
  for (const std::vector<float>& xi : x) {
    Input& input = inputs.emplace_back();
    input.d = static_cast<int64_t>(xi.size()) / kTokens;
    for (int dev = 0; dev < n; ++dev) {
      const int64_t begin = kTokens * dev / n, end = kTokens * (dev + 1) / n;
      input.shards.emplace_back(api, ctx, on(dev), end - begin, input.d, DLDataType{kDLFloat, 32, 1});
      input.shards.back().Upload(xi.data() + begin * input.d);
      input.partials.emplace_back(api, ctx, on(dev), input.d, input.d, DLDataType{kDLFloat, 32, 1});
      input.in.push_back(input.shards.back().dl);
      input.parts.push_back(input.partials.back().dl);
    }
  }
  std::deque<Buffer> hessians;
  for (const Input& input : inputs)
    hessians.emplace_back(api, ctx, on(0), input.d, input.d, DLDataType{kDLFloat, 32, 1});
  auto accumulate = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < inputs.size(); ++i) {
      Input& input = inputs[i];
      for (Buffer& partial : input.partials) {
        partial.Upload(std::vector<float>(static_cast<size_t>(input.d * input.d), 0.0f).data());
      }
      qlink_hessian_args acc{QLINK_HESSIAN_ARGS_STRUCT_SIZE,
                             input.in.data(),
                             input.in.size(),
                             input.parts.data(),
                             input.parts.size(),
                             nullptr,
                             0};
      Check(api, api.hessian_accumulate(ctx, &acc), "hessian_accumulate");
      qlink_reduce_args merge{QLINK_REDUCE_ARGS_STRUCT_SIZE,
                              input.parts.data(),
                              input.parts.size(),
                              &hessians[i].dl,
                              2.0 / kTokens,
                              nullptr,
                              0};
      Check(api, api.reduce(ctx, &merge), "reduce");
    }
    for (int dev = 0; dev < n; ++dev) Check(api, api.stream_synchronize(ctx, dev, nullptr), "stream_synchronize");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The first call pays for setting up (scratch pools, the vendor libraries and their
  // handles): said on its own, and the figures are of the calls after it.
  const double first_hessian_s = accumulate();
  const double hessian_s = accumulate();

  // Solves every linear three ways: serially on device 0, over every device, and with an
  // identity Hessian (round-to-nearest on the same groups).
  std::deque<Buffer> identities;
  for (int64_t d : {kHidden, kIntermediate}) {
    std::vector<float> eye(static_cast<size_t>(d * d), 0.0f);
    for (int64_t i = 0; i < d; ++i) eye[i * d + i] = 1.0f;
    identities.emplace_back(api, ctx, on(0), d, d, DLDataType{kDLFloat, 32, 1});
    identities.back().Upload(eye.data());
  }
  const qlink_gptq_options options{QLINK_GPTQ_OPTIONS_STRUCT_SIZE, 4, 64, 1, 1, 0, 0, 0.01, 0.01, kTokens, 0};
  struct Run {
    std::deque<Buffer> weights, codes, dequantized;
    double seconds = 0;
  };
  auto solve = [&](const std::vector<int32_t>& devices, bool rtn) {
    Run run;
    std::vector<qlink_gptq_layer> specs;
    for (const Linear& lin : linears) {
      run.weights.emplace_back(api, ctx, on(0), lin.rows, lin.cols, DLDataType{kDLFloat, 32, 1});
      run.weights.back().Upload(lin.w.data());
      run.codes.emplace_back(api, ctx, on(0), lin.rows, lin.cols, DLDataType{kDLUInt, 8, 1});
      run.dequantized.emplace_back(api, ctx, on(0), lin.rows, lin.cols, DLDataType{kDLFloat, 32, 1});
      const Buffer& h = rtn ? identities[lin.cols == kHidden ? 0 : 1] : hessians[lin.input];
      specs.push_back({QLINK_GPTQ_LAYER_STRUCT_SIZE, lin.name.c_str(), &run.weights.back().dl, &h.dl,
                       &run.codes.back().dl, nullptr, nullptr, nullptr, &run.dequantized.back().dl, 0, 0});
    }
    qlink_gptq_args args{
        QLINK_GPTQ_ARGS_STRUCT_SIZE, &options, specs.data(), specs.size(), devices.data(), devices.size(), nullptr, 0};
    const auto t0 = std::chrono::steady_clock::now();
    Check(api, api.gptq_quantize(ctx, &args), "gptq_quantize");
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return run;
  };
  std::vector<int32_t> all;
  for (int32_t d = 0; d < n; ++d) all.push_back(d);
  const double first_solve_s = solve(all, false).seconds;
  const Run serial = solve({0}, false), parallel = solve(all, false), rtn = solve({0}, true);

  uint64_t equal = 0, total = 0;
  double gptq_error = 0, rtn_error = 0;
  int beaten = 0;
  for (size_t i = 0; i < linears.size(); ++i) {
    const auto a = serial.codes[i].Download<uint8_t>(), b = parallel.codes[i].Download<uint8_t>();
    for (size_t k = 0; k < a.size(); ++k) equal += a[k] == b[k];
    total += a.size();
    const Linear& lin = linears[i];
    const double e = OutputError(x[lin.input], lin.w, parallel.dequantized[i].Download<float>(), lin.rows, lin.cols);
    const double r = OutputError(x[lin.input], lin.w, rtn.dequantized[i].Download<float>(), lin.rows, lin.cols);
    gptq_error += e;
    rtn_error += r;
    beaten += e < r ? 1 : 0;
  }
  const char* backend = nullptr;
  Check(api, api.backend_name(ctx, &backend), "backend_name");
  std::printf(
      "demo: GPTQ 4-bit g64 act-order of a %d-layer Llama-shaped model (hidden %d, intermediate %d, %zu "
      "linears, %d tokens) on %s x %d\n",
      kLayers, kHidden, kIntermediate, linears.size(), kTokens, backend, n);
  std::printf("  first calls (setting up scratch and the vendor libraries): Hessians %.1f ms, solve %.1f ms\n",
              first_hessian_s * 1e3, first_solve_s * 1e3);
  std::printf(
      "  per decoder layer, after them: Hessians %.1f ms (per-device partials, device-order merge), "
      "solve %.1f ms on 1 device\n",
      hessian_s * 1e3 / kLayers, serial.seconds * 1e3 / kLayers);
  if (n > 1) {
    std::printf("  solve data-parallel over %d devices: %.1f ms per layer, %.2fx the 1-device solve\n", n,
                parallel.seconds * 1e3 / kLayers, serial.seconds / parallel.seconds);
    std::printf("  codes equal between the 1-device and the data-parallel solve: %.4f %%\n", 100.0 * equal / total);
  }
  std::printf("  output error vs round-to-nearest: %.3fx lower (GPTQ below RTN on %d of %zu linears)\n",
              rtn_error / gptq_error, beaten, linears.size());
  return equal == total && beaten == static_cast<int>(linears.size()) ? 0 : 1;
}
