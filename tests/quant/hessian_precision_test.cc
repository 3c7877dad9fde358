// hessian_accumulate's precision (ABI 1.6) on the CPU backend: the config field and the
// per-call field, their refusals, a 1.4-sized struct reading as DEFAULT, and "tensor"
// giving the IEEE fp32 result where there are no tensor cores (16-bit products are exact
// in fp32, so the CPU sums the same products the same way). Then input_partials (1.8):
// many partials of one device in one call, each equal to its inputs accumulated alone.
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/host/plugin.h"

namespace {

using qlink_test::Plugin;
using ::testing::HasSubstr;

constexpr DLDataType kF32{kDLFloat, 32, 1}, kBF16{kDLBfloat, 16, 1}, kF16{kDLFloat, 16, 1};

// A host-memory tensor of the CPU backend's virtual device 0.
struct Matrix {
  Matrix(int64_t rows, int64_t cols, DLDataType dtype) : shape{rows, cols} {
    bytes.assign(static_cast<size_t>(rows * cols * dtype.bits / 8), 0);
    dl = DLTensor{bytes.data(), DLDevice{kDLCPU, 0}, 2, dtype, shape, nullptr, 0};
  }
  Matrix(const Matrix&) = delete;
  std::vector<uint8_t> bytes;
  int64_t shape[2];
  DLTensor dl;
};

// Activations of `dtype` with a few outlier channels, as a decoder layer's inputs have.
void FillActivations(Matrix* x, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = x->shape[0], cols = x->shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = normal(gen) * (c % 17 == 3 ? 40.0f : 1.0f);
      uint32_t f;
      std::memcpy(&f, &v, 4);
      const size_t i = static_cast<size_t>(r * cols + c);
      if (x->dl.dtype.bits == 32) {
        std::memcpy(&x->bytes[4 * i], &f, 4);
        continue;
      }
      // bf16: the top half (truncated; any 16-bit value will do). fp16: from a small value's bits.
      const uint16_t h = x->dl.dtype.code == kDLBfloat ? static_cast<uint16_t>(f >> 16)
                                                       : static_cast<uint16_t>(0x3000 + (f >> 19) % 0x2000);
      std::memcpy(&x->bytes[2 * i], &h, 2);
    }
  }
}

Plugin& Loaded() {
  static Plugin* plugin = new Plugin();
  return *plugin;
}

class HessianPrecision : public ::testing::Test {
 protected:
  HessianPrecision() : api_(Loaded().api()) {}
  qlink_context* Make(const std::string& extra = "") {
    contexts_.emplace_back(Loaded(), R"({"backend": "cpu", "log_level": "off", "cpu_devices": 1)" + extra + "}");
    EXPECT_EQ(contexts_.back().status(), QLINK_OK) << api_.last_error();
    return contexts_.back().get();
  }
  // partial += X^T X with `precision` in a struct of `size` bytes; the call's status.
  qlink_status Accumulate(qlink_context* ctx, const Matrix& x, Matrix* partial, int32_t precision,
                          size_t size = QLINK_HESSIAN_ARGS_STRUCT_SIZE) {
    qlink_hessian_args args{size, &x.dl, 1, &partial->dl, 1, nullptr, 0, precision};
    return api_.hessian_accumulate(ctx, &args);
  }
  // partials[input_partials[i]] += X_i^T X_i for every input, in one call of `size` bytes.
  qlink_status AccumulateNamed(qlink_context* ctx, const std::deque<Matrix>& inputs, std::deque<Matrix>* partials,
                               const int32_t* input_partials, size_t size = QLINK_HESSIAN_ARGS_STRUCT_SIZE) {
    std::vector<DLTensor> in, out;
    for (const Matrix& x : inputs) in.push_back(x.dl);
    for (Matrix& p : *partials) out.push_back(p.dl);
    qlink_hessian_args args{size,          in.data(), in.size(), out.data(),
                            out.size(),    nullptr,   0,         QLINK_HESSIAN_PRECISION_DEFAULT,
                            input_partials};
    return api_.hessian_accumulate(ctx, &args);
  }
  const qlink_api& api_;
  std::deque<qlink_test::Context> contexts_;
};

TEST_F(HessianPrecision, ConfigTakesEachNameAndRefusesAnyOther) {
  Make(R"(, "hessian_precision": "ieee_fp32")");
  Make(R"(, "hessian_precision": "tensor")");
  Make(R"(, "hessian_precision": "tensor_gemm")");
  for (const char* bad : {R"("fast")", "2", "null"}) {
    qlink_test::Context ctx(Loaded(), std::string(R"({"backend": "cpu", "hessian_precision": )") + bad + "}");
    EXPECT_EQ(ctx.status(), QLINK_INVALID_ARGUMENT) << bad;
    EXPECT_THAT(api_.last_error(), HasSubstr("'hessian_precision'")) << bad;
  }
  qlink_test::Context ctx(Loaded(), R"({"backend": "cpu", "hessian_precision": "fast"})");
  EXPECT_THAT(api_.last_error(),
              HasSubstr("'hessian_precision' = \"fast\" is not one of: ieee_fp32, tensor, tensor_gemm"));
}

TEST_F(HessianPrecision, AnUnknownValueIsRefusedByNameAndWritesNothing) {
  qlink_context* ctx = Make();
  Matrix x(40, 24, kBF16), partial(24, 24, kF32);
  FillActivations(&x, 1);
  std::memset(partial.bytes.data(), 0x5A, partial.bytes.size());
  const std::vector<uint8_t> before = partial.bytes;
  for (int32_t bad : {4, -1, 1000}) {
    EXPECT_EQ(Accumulate(ctx, x, &partial, bad), QLINK_INVALID_ARGUMENT) << bad;
    EXPECT_THAT(api_.last_error(), HasSubstr("args->precision = " + std::to_string(bad) + " is not one of"));
    EXPECT_EQ(partial.bytes, before) << bad;
  }
}

// On the CPU every precision, asked per call or by the config, gives the IEEE fp32 bytes:
// the same products (exact for 16-bit inputs), summed the same way.
TEST_F(HessianPrecision, TensorGivesTheIeeeResultWithoutTensorCores) {
  for (DLDataType dtype : {kBF16, kF16, kF32}) {
    Matrix x(300, 40, dtype);
    FillActivations(&x, 7);
    std::vector<std::vector<uint8_t>> results;
    auto run = [&](qlink_context* ctx, int32_t precision) {
      Matrix partial(40, 40, kF32);
      ASSERT_EQ(Accumulate(ctx, x, &partial, precision), QLINK_OK) << api_.last_error();
      results.push_back(partial.bytes);
    };
    qlink_context* ieee = Make();
    qlink_context* tensor = Make(R"(, "hessian_precision": "tensor")");
    qlink_context* gemm = Make(R"(, "hessian_precision": "tensor_gemm")");
    run(ieee, QLINK_HESSIAN_PRECISION_IEEE_FP32);
    run(ieee, QLINK_HESSIAN_PRECISION_TENSOR);
    run(ieee, QLINK_HESSIAN_PRECISION_TENSOR_GEMM);
    run(ieee, QLINK_HESSIAN_PRECISION_DEFAULT);
    run(tensor, QLINK_HESSIAN_PRECISION_DEFAULT);
    run(tensor, QLINK_HESSIAN_PRECISION_IEEE_FP32);
    run(gemm, QLINK_HESSIAN_PRECISION_DEFAULT);
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_EQ(results[i], results[0]) << "dtype bits " << int(dtype.bits) << ", run " << i;
    }
    float first = 0;
    std::memcpy(&first, results[0].data(), 4);
    EXPECT_GT(first, 0.0f) << "the partial received X^T X";
  }
}

// A host built against 1.4 passes a struct ending at num_streams: whatever lies beyond it
// is not read (here an invalid precision), so the call takes the config's precision.
TEST_F(HessianPrecision, AOneFourStructReadsAsTheDefault) {
  qlink_context* ctx = Make();
  Matrix x(64, 16, kBF16);
  FillActivations(&x, 3);
  Matrix old_size(16, 16, kF32), current(16, 16, kF32);
  ASSERT_EQ(Accumulate(ctx, x, &old_size, 77, QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_4), QLINK_OK) << api_.last_error();
  ASSERT_EQ(Accumulate(ctx, x, &current, QLINK_HESSIAN_PRECISION_DEFAULT), QLINK_OK) << api_.last_error();
  EXPECT_EQ(old_size.bytes, current.bytes);
  EXPECT_EQ(Accumulate(ctx, x, &current, 77, QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_4 - 1), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args->struct_size"));
}

// An MoE layer's experts: five inputs (routed rows of different counts) into three partials
// of one device, expert 1 receiving none; each partial bit-identical to its own inputs
// accumulated alone, in the order given; the one that received none left as it was.
TEST_F(HessianPrecision, NamedPartialsOfOneDeviceEachEqualTheirInputsAlone) {
  qlink_context* ctx = Make();
  std::deque<Matrix> inputs, partials, alone;
  const std::vector<int32_t> to = {0, 2, 0, 2, 2};
  const int64_t rows[] = {37, 5, 64, 1, 20};
  for (size_t i = 0; i < to.size(); ++i) {
    inputs.emplace_back(rows[i], 24, kBF16);
    FillActivations(&inputs.back(), 10 + static_cast<uint32_t>(i));
  }
  for (int e = 0; e < 3; ++e) {
    partials.emplace_back(24, 24, kF32);
    alone.emplace_back(24, 24, kF32);
  }
  ASSERT_EQ(AccumulateNamed(ctx, inputs, &partials, to.data()), QLINK_OK) << api_.last_error();
  for (size_t i = 0; i < to.size(); ++i) {
    ASSERT_EQ(Accumulate(ctx, inputs[i], &alone[to[i]], QLINK_HESSIAN_PRECISION_DEFAULT), QLINK_OK);
  }
  for (int e = 0; e < 3; ++e) EXPECT_EQ(partials[e].bytes, alone[e].bytes) << "expert " << e;
  EXPECT_EQ(partials[1].bytes, std::vector<uint8_t>(partials[1].bytes.size(), 0)) << "no rows, no change";
}

// Without input_partials (NULL, or a 1.6-sized struct that ends before it) two partials of
// one device are refused as before, naming the field that would allow them.
TEST_F(HessianPrecision, WithoutNamesTwoPartialsOfOneDeviceAreRefused) {
  qlink_context* ctx = Make();
  std::deque<Matrix> inputs, partials;
  inputs.emplace_back(8, 16, kBF16);
  partials.emplace_back(16, 16, kF32);
  partials.emplace_back(16, 16, kF32);
  const int32_t to[] = {1};
  EXPECT_EQ(AccumulateNamed(ctx, inputs, &partials, nullptr), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args->partials[1] is a second partial on device 0 (input_partials"));
  EXPECT_EQ(AccumulateNamed(ctx, inputs, &partials, to, QLINK_HESSIAN_ARGS_STRUCT_SIZE_1_6), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args->partials[1] is a second partial on device 0 (input_partials"));
}

// A name out of range, or a partial on another device than its input, is refused naming the
// entry, before anything is written.
TEST_F(HessianPrecision, ABadNameIsRefusedByEntryAndWritesNothing) {
  contexts_.emplace_back(Loaded(), R"({"backend": "cpu", "log_level": "off", "cpu_devices": 2})");
  qlink_context* ctx = contexts_.back().get();
  std::deque<Matrix> inputs, partials;
  inputs.emplace_back(8, 16, kBF16);
  inputs.emplace_back(8, 16, kBF16);
  FillActivations(&inputs[0], 1);
  FillActivations(&inputs[1], 2);
  partials.emplace_back(16, 16, kF32);
  partials.emplace_back(16, 16, kF32);
  partials[1].dl.device.device_id = 1;
  const std::vector<uint8_t> before = partials[0].bytes;
  const std::pair<std::vector<int32_t>, std::string> cases[] = {
      {{0, 2}, "args->input_partials[1] = 2 is not an index of args->partials (2)"},
      {{0, -1}, "args->input_partials[1] = -1 is not an index of args->partials (2)"},
      {{0, 1}, "args->input_partials[1] = 1: args->inputs[1] is on device 0, its partial on device 1"},
  };
  for (const auto& [to, why] : cases) {
    EXPECT_EQ(AccumulateNamed(ctx, inputs, &partials, to.data()), QLINK_INVALID_ARGUMENT) << why;
    EXPECT_THAT(api_.last_error(), HasSubstr(why));
    EXPECT_EQ(partials[0].bytes, before) << why;
  }
}

}  // namespace
