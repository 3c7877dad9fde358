// The engine (through the C ABI, by plugin_api/qlink_libtorch.hpp) against the independent
// ATen reference (gptq_reference.h) on the CPU backend, for every option combination.
//
// Bit for bit: the engine is pointed at the very BLAS and LAPACK files ATen resolved in
// this process, so both run the same kernels (which ones is the machine's: the BUILD file
// runs this test once over OpenBLAS and once over the reference BLAS, choosing ATen's by
// LD_LIBRARY_PATH, and QLINK_TEST_EXPECT_BLAS makes sure the choice took).
#include <dlfcn.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "plugin_api/qlink_libtorch.hpp"
#include "tests/host/runfiles.h"
#include "tests/quant/gptq_reference.h"

namespace {

using qlink::libtorch::Context;
using qlink::libtorch::GptqOptions;
using qlink::libtorch::Library;

Library& Lib() {
  static Library lib(qlink_test::RunfilePath("libqlink.so"));
  return lib;
}

// The file that defines `symbol` in this process's global scope, where libtorch's own
// references were bound.
std::string FileDefining(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0) return "";
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

// The CPU backend on ATen's own BLAS and LAPACK, the process's OpenBLAS (where it is) on one
// thread: the engine runs it so inside its calls (quant/cpu/lapack_api.h, SerialBlas), and
// the reference's products block alike only on one thread too.
std::string Config() {
  static const std::string config = [] {
    using SetThreads = void(int);
    if (void* set = dlsym(RTLD_DEFAULT, "openblas_set_num_threads")) reinterpret_cast<SetThreads*>(set)(1);
    const std::string blas = FileDefining("sgemm_"), lapack = FileDefining("spotrf_");
    std::printf("engine and reference on BLAS %s, LAPACK %s\n", blas.c_str(), lapack.c_str());
    return R"({"backend": "cpu", "cpu_devices": 1, "log_level": "warn", "blas_library": ")" + blas +
           R"(", "solver_library": ")" + lapack + R"("})";
  }();
  return config;
}

// The BLAS this target chose (QLINK_TEST_EXPECT_BLAS, set by the BUILD file with the
// LD_LIBRARY_PATH that chooses it) is the one ATen runs on, so neither target silently
// tests the other's library.
TEST(Libraries, AtenRunsOnTheBlasThisTargetChose) {
  const std::string blas = FileDefining("sgemm_"), lapack = FileDefining("spotrf_");
  ASSERT_FALSE(blas.empty() || lapack.empty()) << "ATen's BLAS/LAPACK not found in the process";
  const char* expect = std::getenv("QLINK_TEST_EXPECT_BLAS");
  ASSERT_NE(expect, nullptr) << "the BUILD file sets QLINK_TEST_EXPECT_BLAS";
  EXPECT_NE(blas.find(expect), std::string::npos) << "ATen resolved sgemm_ from " << blas << ", not " << expect;
}

// A random layer: weight (rows, cols) and H = X^T X of `tokens` activations whose columns
// listed in `dead` are zero (dead Hessian columns).
std::tuple<at::Tensor, at::Tensor> Layer(int64_t rows, int64_t cols, int64_t seed, std::vector<int64_t> dead = {}) {
  at::manual_seed(seed);
  at::Tensor w = at::randn({rows, cols});
  at::Tensor x = at::randn({4 * cols, cols}) * at::rand({cols}) + 0.1 * at::randn({cols});
  for (int64_t c : dead) x.select(1, c).zero_();
  at::Tensor h = at::matmul(x.t(), x) * (2.0 / x.size(0));
  return {w, h};
}

struct Combo {
  int bits, group_size;
  bool sym, desc_act, static_groups, act_group_aware = false;
};

std::string Name(const Combo& c) {
  char s[96];
  std::snprintf(s, sizeof(s), "bits%d_g%s%d_%s%s%s%s", c.bits, c.group_size < 0 ? "minus" : "", std::abs(c.group_size),
                c.sym ? "sym" : "asym", c.desc_act ? "_descact" : "", c.static_groups ? "_static" : "",
                c.act_group_aware ? "_groupaware" : "");
  return s;
}

class EveryCombination : public ::testing::TestWithParam<Combo> {};

TEST_P(EveryCombination, CodesScalesZerosAndLossMatchTheReference) {
  const Combo c = GetParam();
  Context ctx(Lib(), Config());
  auto [w, h] = Layer(48, 384, c.bits * 1000 + c.group_size, {5, 200});
  GptqOptions o;
  o.bits = c.bits;
  o.group_size = c.group_size;
  o.sym = c.sym;
  o.desc_act = c.desc_act;
  o.static_groups = c.static_groups;
  o.act_group_aware = c.act_group_aware;
  o.nsamples = 0;
  const auto got = ctx.gptq_quantize(w, h, o);
  qlink_test::ReferenceOptions ro;
  ro.bits = c.bits;
  ro.group_size = c.group_size;
  ro.sym = c.sym;
  ro.desc_act = c.desc_act;
  ro.static_groups = c.static_groups;
  ro.act_group_aware = c.act_group_aware;
  const auto want = qlink_test::ReferenceGptq(w, h, ro);

  const at::Tensor same = got.codes == want.codes;
  const double equal = same.to(at::kDouble).mean().item<double>();
  EXPECT_GE(equal, 0.999) << Name(c) << ": share of codes equal to the reference";
  // Where a row's codes all agree, its scales and zeros must too; g_idx always.
  const at::Tensor rows_same = same.all(1);
  EXPECT_TRUE(at::equal(got.scales.index({rows_same}), want.scales.index({rows_same}))) << Name(c);
  EXPECT_TRUE(at::equal(got.zeros.index({rows_same}), want.zeros.index({rows_same}))) << Name(c);
  EXPECT_TRUE(at::equal(got.g_idx, want.g_idx)) << Name(c);
  EXPECT_TRUE(at::equal(got.weight.index({rows_same}), want.weight.index({rows_same}))) << Name(c);
  EXPECT_NEAR(got.loss, want.loss_sum, 1e-3 * want.loss_sum) << Name(c);
  EXPECT_EQ(got.damp, want.damp);
  // The outputs agree with each other: weight = scale * (code - zero) per column's group.
  const at::Tensor g = got.g_idx.to(at::kLong);
  const at::Tensor rebuilt = got.scales.index_select(1, g) * (got.codes.to(at::kFloat) - got.zeros.index_select(1, g));
  EXPECT_TRUE(at::equal(rebuilt, got.weight)) << Name(c);
}

std::vector<Combo> Combos() {
  std::vector<Combo> all;
  for (int bits : {2, 3, 4, 8}) {
    for (int gs : {-1, 32, 64, 128}) {
      for (bool sym : {true, false}) {
        for (bool desc : {false, true}) {
          for (bool stat : {false, true}) {
            if (stat && gs == -1) continue;
            all.push_back({bits, gs, sym, desc, stat});
          }
        }
        if (gs != -1) all.push_back({bits, gs, sym, false, false, /*act_group_aware=*/true});
      }
    }
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Gptq, EveryCombination, ::testing::ValuesIn(Combos()),
                         [](const ::testing::TestParamInfo<Combo>& info) { return Name(info.param); });

// A bf16 weight comes back as bf16, rounded from the fp32 result.
TEST(Dtypes, Bf16WeightIsQuantizedAsItsFp32Values) {
  Context ctx(Lib(), Config());
  auto [w, h] = Layer(32, 256, 7);
  const at::Tensor wb = w.to(at::kBFloat16);
  const auto got = ctx.gptq_quantize(wb, h);
  const auto want = ctx.gptq_quantize(wb.to(at::kFloat), h);
  EXPECT_EQ(got.weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(got.codes, want.codes));
  EXPECT_TRUE(at::equal(got.weight, want.weight.to(at::kBFloat16)));
}

// Hessian accumulation: X^T X of bf16 and fp32 activations as the reference computes it.
TEST(Hessian, AccumulatesXtXOverBatches) {
  Context ctx(Lib(), Config());
  at::manual_seed(3);
  const at::Tensor a = at::randn({2, 50, 96}), b = at::randn({70, 96}).to(at::kBFloat16);
  at::Tensor h = at::zeros({96, 96});
  ctx.hessian_accumulate({a}, {h});
  ctx.hessian_accumulate({b}, {h});
  const at::Tensor x = at::cat({a.reshape({-1, 96}), b.to(at::kFloat)});
  const at::Tensor want = at::matmul(x.t(), x);
  EXPECT_TRUE(at::allclose(h, want, 1e-5, 1e-4));
  EXPECT_TRUE(at::equal(h, h.t())) << "both triangles written";
}

}  // namespace
