// The GPTQ engine through the C ABI on the CPU backend, without LibTorch (so it runs under
// every sanitizer): results independent of the world size and of the arrival order of
// Hessian partials, every refusal named and writing nothing, concurrent calls.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/host/plugin.h"

namespace {

using qlink_test::Plugin;
using ::testing::HasSubstr;

// A host-memory 2-D tensor of the CPU backend's virtual device `device`.
struct Matrix {
  Matrix(int64_t rows, int64_t cols, DLDataType dtype, int device) : shape{rows, cols} {
    bytes.assign(static_cast<size_t>(rows * std::max<int64_t>(cols, 1) * dtype.bits / 8), 0xAB);
    dl = DLTensor{bytes.data(), DLDevice{kDLCPU, device}, cols > 0 ? 2 : 1, dtype, shape, nullptr, 0};
  }
  Matrix(const Matrix&) = delete;
  float* f() { return reinterpret_cast<float*>(bytes.data()); }
  std::vector<uint8_t> bytes;
  int64_t shape[2];
  DLTensor dl;
};

constexpr DLDataType kF32{kDLFloat, 32, 1}, kU8{kDLUInt, 8, 1}, kI32{kDLInt, 32, 1};

// One layer's tensors: weight and Hessian in, every output.
struct LayerData {
  LayerData(int64_t rows, int64_t cols, int64_t groups, int device)
      : weight(rows, cols, kF32, device),
        codes(rows, cols, kU8, device),
        scales(rows, groups, kF32, device),
        zeros(rows, groups, kF32, device),
        g_idx(cols, 0, kI32, device),
        dequantized(rows, cols, kF32, device) {}
  Matrix weight, codes, scales, zeros, g_idx, dequantized;
  // name: borrowed, as the ABI takes it.
  qlink_gptq_layer spec(const char* name, const Matrix& hessian) {
    return {QLINK_GPTQ_LAYER_STRUCT_SIZE,
            name,
            &weight.dl,
            &hessian.dl,
            &codes.dl,
            &scales.dl,
            &zeros.dl,
            &g_idx.dl,
            &dequantized.dl,
            0,
            0};
  }
  std::vector<uint8_t> outputs() const {
    std::vector<uint8_t> all;
    for (const Matrix* m : {&codes, &scales, &zeros, &g_idx, &dequantized}) {
      all.insert(all.end(), m->bytes.begin(), m->bytes.end());
    }
    return all;
  }
};

void Randn(float* out, size_t n, std::mt19937& gen, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  for (size_t i = 0; i < n; ++i) out[i] = normal(gen);
}

// H = X^T X * 2 / tokens for correlated activations X (tokens x cols).
void FillHessian(Matrix* h, int64_t cols, std::mt19937& gen) {
  const int64_t tokens = 3 * cols;
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  Randn(x.data(), x.size(), gen);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 1; c < cols; ++c) x[t * cols + c] += 0.5f * x[t * cols + c - 1];
  }
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t t = 0; t < tokens; ++t) s += double(x[t * cols + i]) * x[t * cols + j];
      h->f()[i * cols + j] = static_cast<float>(s * 2 / tokens);
    }
  }
}

// One plugin for the whole process, as a host keeps it: unloading libqlink.so after the
// CPU backend has loaded LAPACK takes LAPACK down with it.
Plugin& Loaded() {
  static Plugin* plugin = new Plugin();
  return *plugin;
}

class Gptq : public ::testing::Test {
 protected:
  Gptq() : plugin_(Loaded()), api_(plugin_.api()) {}
  qlink_context* Make(int devices) {
    contexts_.emplace_back(plugin_,
                           R"({"backend": "cpu", "log_level": "off", "cpu_devices": )" + std::to_string(devices) + "}");
    EXPECT_EQ(contexts_.back().status(), QLINK_OK) << api_.last_error();
    return contexts_.back().get();
  }
  qlink_gptq_options Options(int bits = 4, int group_size = 32, int desc_act = 0) {
    return {QLINK_GPTQ_OPTIONS_STRUCT_SIZE, bits, group_size, 1, desc_act, 0, 0, 0.01, 0.01, 128};
  }
  // down_proj's outputs after a fresh Block's 7 linears are quantized with `o` on `ctx`.
  std::vector<uint8_t> DownProjOutputs(qlink_context* ctx, const qlink_gptq_options& o);
  Plugin& plugin_;
  const qlink_api& api_;
  std::deque<qlink_test::Context> contexts_;
};

// The 7 linears of a decoder layer, scaled down: q/k/v share one Hessian, gate/up another.
// down_proj, the costliest, is what an eighth device splits: 200 rows, two row tiles
// (quant_math.h's kRowTile) on one device and the short third on another.
struct Block {
  explicit Block(int device = 0) {
    std::mt19937 gen(42);
    for (int64_t cols : {64, 64, 64, 160}) {
      hessians.emplace_back(cols, cols, kF32, device);
      FillHessian(&hessians.back(), cols, gen);
    }
    const struct {
      const char* name;
      int64_t rows;
      size_t h;
    } shapes[] = {{"q_proj", 64, 0},     {"k_proj", 64, 0},   {"v_proj", 64, 0},    {"o_proj", 64, 1},
                  {"gate_proj", 160, 2}, {"up_proj", 160, 2}, {"down_proj", 200, 3}};
    for (const auto& s : shapes) {
      const int64_t cols = hessians[s.h].shape[0];
      layers.emplace_back(s.rows, cols, cols / 32, device);
      Randn(layers.back().weight.f(), static_cast<size_t>(s.rows * cols), gen);
      names.push_back(s.name);
      hessian_of.push_back(s.h);
    }
  }
  std::vector<qlink_gptq_layer> specs() {
    std::vector<qlink_gptq_layer> out;
    for (size_t i = 0; i < layers.size(); ++i) out.push_back(layers[i].spec(names[i].c_str(), hessians[hessian_of[i]]));
    return out;
  }
  std::deque<Matrix> hessians;
  std::deque<LayerData> layers;
  std::vector<std::string> names;
  std::vector<size_t> hessian_of;
};

std::vector<uint8_t> Gptq::DownProjOutputs(qlink_context* ctx, const qlink_gptq_options& o) {
  Block block;
  auto specs = block.specs();
  qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(), nullptr, 0, nullptr, 0};
  EXPECT_EQ(api_.gptq_quantize(ctx, &args), QLINK_OK) << api_.last_error();
  return block.layers[6].outputs();
}

TEST_F(Gptq, ResultsAreBitIdenticalAcrossWorldsOneToEight) {
  // Per column order (as given, act-order, group-aware): each layer's outputs and loss at
  // the first world run with it.
  std::map<int, std::vector<std::pair<std::vector<uint8_t>, double>>> first;
  for (int world = 1; world <= 8; ++world) {
    qlink_context* ctx = Make(8);
    Block block;
    auto specs = block.specs();
    std::vector<int32_t> devices(world);
    for (int d = 0; d < world; ++d) devices[d] = (d + 3) % 8;  // not the layers' own device first
    const int order = world % 3;
    qlink_gptq_options o = Options(4, 32, order == 1);
    o.act_group_aware = order == 2;
    qlink_gptq_args args{
        QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(), devices.data(), devices.size(), nullptr, 0};
    ASSERT_EQ(api_.gptq_quantize(ctx, &args), QLINK_OK) << "world " << world << ": " << api_.last_error();
    auto [it, fresh] = first.try_emplace(order);
    for (size_t i = 0; i < block.layers.size(); ++i) {
      EXPECT_GT(specs[i].loss, 0);
      EXPECT_EQ(specs[i].damp, 0.01);
      if (fresh) {
        it->second.emplace_back(block.layers[i].outputs(), specs[i].loss);
        continue;
      }
      EXPECT_EQ(block.layers[i].outputs(), it->second[i].first) << "world " << world << ", " << block.names[i];
      EXPECT_EQ(specs[i].loss, it->second[i].second) << "world " << world << ", " << block.names[i];
    }
  }
}

// The triangular inverse (ABI 1.11) makes the same U up to fp32 rounding: each layer's codes
// equal the Cholesky inverse's but for near-ties, its loss within 0.1 %; and, like it,
// whatever the world.
TEST_F(Gptq, TheTriangularInverseAgreesWithTheCholeskyInverseInEveryWorld) {
  std::vector<std::pair<std::vector<uint8_t>, double>> chain, first;
  for (int world : {0, 1, 3, 8}) {  // 0: the Cholesky inverse, world 1
    qlink_context* ctx = Make(8);
    Block block;
    auto specs = block.specs();
    std::vector<int32_t> devices(std::max(world, 1));
    for (size_t d = 0; d < devices.size(); ++d) devices[d] = static_cast<int32_t>((d + 5) % 8);
    qlink_gptq_options o = Options();
    o.inverse = world == 0 ? QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE : QLINK_GPTQ_INVERSE_TRIANGULAR;
    qlink_gptq_args args{
        QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(), devices.data(), devices.size(), nullptr, 0};
    ASSERT_EQ(api_.gptq_quantize(ctx, &args), QLINK_OK) << "world " << world << ": " << api_.last_error();
    for (size_t i = 0; i < block.layers.size(); ++i) {
      const LayerData& l = block.layers[i];
      std::vector<uint8_t> codes(l.codes.bytes);
      if (world == 0) {
        chain.emplace_back(codes, specs[i].loss);
      } else if (world == 1) {
        first.emplace_back(l.outputs(), specs[i].loss);
        size_t equal = 0;
        for (size_t k = 0; k < codes.size(); ++k) equal += codes[k] == chain[i].first[k];
        EXPECT_GE(equal, codes.size() * 99 / 100) << block.names[i];
        EXPECT_NEAR(specs[i].loss, chain[i].second, 1e-3 * chain[i].second) << block.names[i];
      } else {
        EXPECT_EQ(l.outputs(), first[i].first) << "world " << world << ", " << block.names[i];
        EXPECT_EQ(specs[i].loss, first[i].second) << "world " << world << ", " << block.names[i];
      }
    }
  }
}

// The OpenBLAS kernels this target chose (QLINK_TEST_EXPECT_OPENBLAS_CORE, set by the BUILD
// file with the OPENBLAS_CORETYPE that forces them) are the ones the engine's library runs:
// the engine loads libopenblas.so.0 by name, and its kernels are chosen once per process.
TEST(Blas, OpenBlasRunsTheKernelsThisTargetChose) {
  const char* expect = std::getenv("QLINK_TEST_EXPECT_OPENBLAS_CORE");
  if (expect == nullptr) GTEST_SKIP() << "this target runs the machine's own kernels";
  void* library = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << dlerror();
  using Name = const char*();
  auto* core = reinterpret_cast<Name*>(dlsym(library, "openblas_get_corename"));
  ASSERT_NE(core, nullptr);
  EXPECT_STRCASEEQ(core(), expect);
  dlclose(library);
}

TEST_F(Gptq, LayersOnTheirOwnDevicesMatchAPlacedSolve) {
  qlink_context* ctx = Make(4);
  Block own(2), placed(2);
  auto a = own.specs(), b = placed.specs();
  const qlink_gptq_options o = Options();
  qlink_gptq_args on_own{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, a.data(), a.size(), nullptr, 0, nullptr, 0};
  ASSERT_EQ(api_.gptq_quantize(ctx, &on_own), QLINK_OK) << api_.last_error();
  const int32_t devices[] = {0, 1, 3};
  qlink_gptq_args spread{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, b.data(), b.size(), devices, 3, nullptr, 0};
  ASSERT_EQ(api_.gptq_quantize(ctx, &spread), QLINK_OK) << api_.last_error();
  for (size_t i = 0; i < own.layers.size(); ++i) EXPECT_EQ(own.layers[i].outputs(), placed.layers[i].outputs());
}

TEST_F(Gptq, MergedHessianIsBitIdenticalForEveryArrivalOrder) {
  qlink_context* ctx = Make(3);
  const int64_t cols = 48, rows = 50;
  std::mt19937 gen(7);
  std::deque<Matrix> x, partials;
  std::vector<DLTensor> inputs, parts;
  for (int d = 0; d < 3; ++d) {
    x.emplace_back(rows + d, cols, kF32, d);
    Randn(x.back().f(), static_cast<size_t>((rows + d) * cols), gen);
    partials.emplace_back(cols, cols, kF32, d);
    std::fill(partials.back().f(), partials.back().f() + cols * cols, 0.0f);
    inputs.push_back(x.back().dl);
    parts.push_back(partials.back().dl);
  }
  qlink_hessian_args acc{QLINK_HESSIAN_ARGS_STRUCT_SIZE, inputs.data(), 3, parts.data(), 3, nullptr, 0};
  ASSERT_EQ(api_.hessian_accumulate(ctx, &acc), QLINK_OK) << api_.last_error();
  // Each partial is X_d^T X_d, whole and symmetric.
  for (int d = 0; d < 3; ++d) {
    for (int64_t i = 0; i < cols; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        double s = 0;
        for (int64_t t = 0; t < rows + d; ++t) s += double(x[d].f()[t * cols + i]) * x[d].f()[t * cols + j];
        ASSERT_NEAR(partials[d].f()[i * cols + j], s, 1e-4 * (1 + std::fabs(s))) << d << " " << i << " " << j;
        ASSERT_EQ(partials[d].f()[i * cols + j], partials[d].f()[j * cols + i]);
      }
    }
  }
  std::vector<int> order = {0, 1, 2};
  std::vector<uint8_t> first;
  do {
    Matrix out(cols, cols, kF32, 0);
    std::vector<DLTensor> listed;
    for (int d : order) listed.push_back(partials[d].dl);
    const qlink_reduce_args merge{QLINK_REDUCE_ARGS_STRUCT_SIZE, listed.data(), 3, &out.dl,
                                  2.0 / (3 * rows + 3),          nullptr,       0};
    ASSERT_EQ(api_.reduce(ctx, &merge), QLINK_OK) << api_.last_error();
    if (first.empty()) first = out.bytes;
    EXPECT_EQ(out.bytes, first) << "arrival order " << order[0] << order[1] << order[2];
  } while (std::next_permutation(order.begin(), order.end()));
}

// Every refusal names what it refuses and leaves every output as it was.
TEST_F(Gptq, RefusalsNameTheArgumentAndWriteNothing) {
  qlink_context* ctx = Make(2);
  Block block;
  auto specs = block.specs();
  std::vector<std::vector<uint8_t>> before;
  for (const LayerData& l : block.layers) before.push_back(l.outputs());
  auto refused = [&](qlink_gptq_options o, const char* why, std::vector<qlink_gptq_layer>* layers = nullptr) {
    auto& use = layers != nullptr ? *layers : specs;
    qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, use.data(), use.size(), nullptr, 0, nullptr, 0};
    EXPECT_EQ(api_.gptq_quantize(ctx, &args), QLINK_INVALID_ARGUMENT) << why;
    EXPECT_THAT(api_.last_error(), HasSubstr(why));
    for (size_t i = 0; i < block.layers.size(); ++i) EXPECT_EQ(block.layers[i].outputs(), before[i]) << why;
  };
  qlink_gptq_options o = Options();
  o.bits = 5;
  refused(o, "options->bits = 5 is not one of 2, 3, 4, 8");
  o = Options(4, 48);
  refused(o, "layers[0] 'q_proj': options->group_size 48 does not divide the weight's 64 columns");
  o = Options();
  o.damp = 1.5;
  refused(o, "options->damp = 1.5");
  o = Options(4, -1);
  o.static_groups = 1;
  refused(o, "options->static_groups needs a group_size");
  o = Options();
  o.struct_size = 8;
  refused(o, "options->struct_size 8 is below the 1.4 size");
  o = Options(4, 32, /*desc_act=*/1);
  o.act_group_aware = 1;
  refused(o, "options->act_group_aware excludes options->desc_act");
  o = Options(4, -1);
  o.act_group_aware = 1;
  refused(o, "options->act_group_aware needs a group_size, got -1");
  o = Options();
  o.inverse = static_cast<int32_t>(7);
  refused(o, "options->inverse = 7 is not a qlink_gptq_inverse");
  {
    auto bad = specs;
    Matrix wrong(48, 48, kF32, 0);
    bad[4].hessian = &wrong.dl;
    refused(Options(), "layers[4] 'gate_proj': hessian has shape (48, 48), expected (64, 64)", &bad);
    bad = specs;
    Matrix narrow(64, 64, kU8, 0);
    bad[0].hessian = &narrow.dl;
    refused(Options(), "layers[0] 'q_proj': hessian has dtype uint8, expected float32", &bad);
    bad = specs;
    const int64_t* down = block.layers[6].weight.shape;
    Matrix codes(down[0], down[1], kF32, 0);
    bad[6].codes = &codes.dl;
    refused(Options(), "layers[6] 'down_proj': codes has dtype float32, expected uint8", &bad);
    bad = specs;
    Matrix elsewhere(64, 64, kF32, 1);
    bad[5].hessian = &elsewhere.dl;
    refused(Options(), "layers[5] 'up_proj': hessian is on device 1, not the weight's device 0", &bad);
  }
  // An indefinite Hessian (o_proj's negated): named with the damps tried; the other layers,
  // whose inverses exist, are not written either.
  Matrix negative(64, 64, kF32, 0);
  for (int64_t i = 0; i < 64 * 64; ++i) negative.f()[i] = -block.hessians[1].f()[i];
  auto bad = specs;
  bad[3].hessian = &negative.dl;
  o = Options();
  o.damp_auto_increment = 0.25;
  refused(o, "layers[3] 'o_proj': the Hessian is not positive definite with damp 0.01 .. 0.76 (4 damps tried", &bad);
  o.damp_auto_increment = 0;
  refused(o, "no other damp tried", &bad);
}

// A 1.5-sized struct reads no inverse: whatever follows it, the Cholesky inverse.
TEST_F(Gptq, OptionsOfTheOneFiveSizeReadTheCholeskyInverse) {
  qlink_context* ctx = Make(1);
  qlink_gptq_options o = Options();
  const std::vector<uint8_t> current = DownProjOutputs(ctx, o);
  o.struct_size = QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_5;
  o.inverse = 7;
  EXPECT_EQ(DownProjOutputs(ctx, o), current);
}

// A host built against 1.4 passes options ending at nsamples: whatever lies beyond is not
// read, so the group-aware order stays off.
TEST_F(Gptq, OptionsOfTheOneFourSizeReadNoGroupAwareOrder) {
  qlink_context* ctx = Make(1);
  qlink_gptq_options o = Options();
  const std::vector<uint8_t> current = DownProjOutputs(ctx, o);
  o.act_group_aware = 1;
  EXPECT_NE(DownProjOutputs(ctx, o), current) << "the group-aware order changes down_proj's result";
  o.struct_size = QLINK_GPTQ_OPTIONS_STRUCT_SIZE_1_4;
  EXPECT_EQ(DownProjOutputs(ctx, o), current);
}

// Without its solver library the engine says which one is missing; the rest of qlink works.
TEST_F(Gptq, AMissingLibraryFailsOnlyTheQuantCallsNamingIt) {
  contexts_.emplace_back(plugin_, R"({"backend": "cpu", "log_level": "off", "cpu_devices": 2,
                                      "solver_library": "libqlink_no_such_lapack.so.3"})");
  ASSERT_EQ(contexts_.back().status(), QLINK_OK) << api_.last_error();
  qlink_context* ctx = contexts_.back().get();
  Block block;
  auto specs = block.specs();
  const qlink_gptq_options o = Options();
  qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(), nullptr, 0, nullptr, 0};
  EXPECT_EQ(api_.gptq_quantize(ctx, &args), QLINK_UNAVAILABLE);
  EXPECT_THAT(api_.last_error(), HasSubstr("'libqlink_no_such_lapack.so.3' cannot be loaded"));
  EXPECT_EQ(block.layers[0].outputs(), LayerData(64, 64, 2, 0).outputs());  // untouched
  std::vector<float> a(16, 1.0f), b(16, 0.0f);
  Matrix src(4, 4, kF32, 0), dst(4, 4, kF32, 1);
  std::memcpy(src.f(), a.data(), 64);
  const qlink_copy_args copy{QLINK_COPY_ARGS_STRUCT_SIZE, &src.dl, &dst.dl, 1, nullptr, 0, 0};
  EXPECT_EQ(api_.copy_batch(ctx, &copy), QLINK_OK) << api_.last_error();
  EXPECT_EQ(std::memcmp(dst.f(), a.data(), 64), 0);
}

TEST_F(Gptq, AutoIncrementRaisesTheDampUntilTheCholeskySucceeds) {
  qlink_context* ctx = Make(1);
  const int64_t cols = 32;
  // Diagonal 1 except one -0.05 entry: damp * mean(diag) (~0.97) must exceed 0.05.
  Matrix h(cols, cols, kF32, 0);
  std::fill(h.f(), h.f() + cols * cols, 0.0f);
  for (int64_t i = 0; i < cols; ++i) h.f()[i * cols + i] = i == 5 ? -0.05f : 1.0f;
  LayerData layer(8, cols, 1, 0);
  std::mt19937 gen(1);
  Randn(layer.weight.f(), 8 * cols, gen);
  auto spec = layer.spec("w", h);
  for (int32_t inverse : {QLINK_GPTQ_INVERSE_CHOLESKY_INVERSE, QLINK_GPTQ_INVERSE_TRIANGULAR}) {
    qlink_gptq_options o = Options(4, 32);
    o.inverse = inverse;
    qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, &spec, 1, nullptr, 0, nullptr, 0};
    ASSERT_EQ(api_.gptq_quantize(ctx, &args), QLINK_OK) << api_.last_error();
    EXPECT_NEAR(spec.damp, 0.06, 1e-12) << inverse;  // 0.01 .. 0.05 fail (0.05 * 0.967 < 0.05)
  }
}

TEST_F(Gptq, ConcurrentCallsFromManyThreads) {
  qlink_context* ctx = Make(4);
  Block reference;
  auto ref_specs = reference.specs();
  const qlink_gptq_options o = Options();
  qlink_gptq_args ref_args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, ref_specs.data(), ref_specs.size(), nullptr, 0, nullptr, 0};
  ASSERT_EQ(api_.gptq_quantize(ctx, &ref_args), QLINK_OK) << api_.last_error();
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Block block;
      auto specs = block.specs();
      const int32_t devices[] = {t, (t + 1) % 4};
      qlink_gptq_args args{QLINK_GPTQ_ARGS_STRUCT_SIZE, &o, specs.data(), specs.size(), devices, 2, nullptr, 0};
      if (api_.gptq_quantize(ctx, &args) != QLINK_OK) return;
      bool same = true;
      for (size_t i = 0; i < block.layers.size(); ++i)
        same = same && block.layers[i].outputs() == reference.layers[i].outputs();
      ok[t] = same ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

}  // namespace
