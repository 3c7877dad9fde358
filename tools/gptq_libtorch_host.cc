// A C++ host on LibTorch that quantizes one linear layer through qlink: calibration
// activations -> Hessian (qlink's hessian_accumulate) -> GPTQ (gptq_quantize), all through
// plugin_api/qlink_libtorch.hpp. It checks what a host would: every level on the 4-bit grid,
// the layer's output error below round-to-nearest's, and prints the timings.
//   gptq_libtorch_host LIBQLINK.so [cpu|cuda] [rows] [columns] [tokens]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>

#include "plugin_api/qlink_libtorch.hpp"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s LIBQLINK.so [cpu|cuda] [rows] [columns] [tokens]\n", argv[0]);
    return 2;
  }
  const std::string where = argc > 2 ? argv[2] : "cpu";
  const int64_t rows = argc > 3 ? std::atoll(argv[3]) : 256, cols = argc > 4 ? std::atoll(argv[4]) : 512;
  const int64_t tokens = argc > 5 ? std::atoll(argv[5]) : 4 * cols;
  try {
    qlink::libtorch::Library lib(argv[1]);
    qlink::libtorch::Context ctx(lib, where == "cuda" ? R"({"backend": "cuda"})" : R"({"backend": "cpu"})");
    const at::TensorOptions on = at::TensorOptions().device(where == "cuda" ? at::kCUDA : at::kCPU);
    at::manual_seed(0);
    // Correlated activations, as a model's are: GPTQ's error feedback has something to use.
    const at::Tensor x = (at::matmul(at::randn({tokens, cols / 8}, on), at::randn({cols / 8, cols}, on)) +
                          0.3 * at::randn({tokens, cols}, on))
                             .to(at::kBFloat16);
    const at::Tensor w = (0.02 * at::randn({rows, cols}, on)).to(at::kBFloat16);

    auto t0 = std::chrono::steady_clock::now();
    at::Tensor h = ctx.hessian({x}, cols);
    h.mul_(2.0 / tokens);
    (void)h[0][0].item<float>();  // waits for the stream-ordered accumulation
    const double hessian_s = Seconds(t0);

    qlink::libtorch::GptqOptions o;
    o.nsamples = static_cast<double>(tokens);
    t0 = std::chrono::steady_clock::now();
    const auto q = ctx.gptq_quantize(w, h, o);
    const double solve_s = Seconds(t0);
    const auto rtn = ctx.gptq_quantize(w, at::eye(cols, on.dtype(at::kFloat)), o);  // identity H: plain rounding

    const at::Tensor xf = x.to(at::kFloat);
    auto output_error = [&](const at::Tensor& wq) {
      return at::matmul(xf, (wq.to(at::kFloat) - w.to(at::kFloat)).t()).pow(2).mean().item<double>();
    };
    const double e_gptq = output_error(q.weight), e_rtn = output_error(rtn.weight);
    const bool on_grid = q.codes.max().item<int64_t>() <= 15;
    std::printf("qlink %s backend, layer %lld x %lld, %lld tokens: Hessian %.1f ms, GPTQ %.1f ms, loss %.6g, damp %g\n",
                where.c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
                static_cast<long long>(tokens), hessian_s * 1e3, solve_s * 1e3, q.loss, q.damp);
    std::printf("output error: GPTQ %.6g, round-to-nearest %.6g (%.2fx lower); levels on the 4-bit grid: %s\n", e_gptq,
                e_rtn, e_rtn / e_gptq, on_grid ? "yes" : "NO");
    return on_grid && e_gptq < e_rtn ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
