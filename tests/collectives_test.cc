// Collectives on the CPU backend's virtual devices (1, 2, 3, 4 and 8), against an fp64
// reference, through the dlopen'ed ABI.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/host/plugin.h"

namespace qlink_test {
namespace {

using ::testing::HasSubstr;

constexpr DLDataType kF32{kDLFloat, 32, 1};

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }

  // world buffers of n floats, buffer d on device d, random values.
  void MakeBuffers(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    data_.assign(world(), std::vector<float>(n));
    for (auto& v : data_) {
      for (auto& x : v) x = normal(rng);
    }
    Describe();
  }
  void Describe() {
    tensors_.clear();
    dl_.clear();
    for (int d = 0; d < world(); ++d) {
      dl_.push_back(tensors_.emplace_back(data_[d].data(), data_[d].size() * 4, kDLCPU, d, kF32).dl);
    }
  }
  std::vector<double> ExactSum() const {
    std::vector<double> sum(data_[0].size(), 0.0);
    for (const auto& v : data_) {
      for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
    }
    return sum;
  }

  Plugin plugin_;
  const qlink_api& api_ = plugin_.api();
  Context ctx_{plugin_, R"({"backend": "cpu", "cpu_devices": 8, "log_level": "off"})"};
  std::vector<std::vector<float>> data_;
  std::deque<Tensor> tensors_;
  std::vector<DLTensor> dl_;
};

TEST_P(Collectives, AllReduceSumAndAverageMatchTheFp64Reference) {
  for (int32_t op : {QLINK_REDUCE_SUM, QLINK_REDUCE_AVG}) {
    MakeBuffers(1000 + 37, 11);  // not a multiple of the world or of the chunk alignment
    const std::vector<double> exact = ExactSum();
    qlink_all_reduce_args args{
        QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), dl_.size(), op, QLINK_TRANSPORT_FP32, nullptr, 0};
    ASSERT_EQ(api_.all_reduce(ctx_.get(), &args), QLINK_OK) << api_.last_error();
    const double div = op == QLINK_REDUCE_AVG ? world() : 1.0;
    for (int d = 0; d < world(); ++d) {
      EXPECT_EQ(std::memcmp(data_[d].data(), data_[0].data(), data_[0].size() * 4), 0) << "replica " << d;
      for (size_t i = 0; i < exact.size(); ++i) {
        ASSERT_NEAR(data_[d][i], exact[i] / div, 1e-5 * (1 + std::abs(exact[i]))) << "element " << i;
      }
    }
  }
}

TEST_P(Collectives, HalvingDoublingMatchesTheFp64ReferenceOnPowerOfTwoWorlds) {
  if ((world() & (world() - 1)) != 0) GTEST_SKIP() << "halving-doubling needs a power-of-two world";
  for (int32_t op : {QLINK_REDUCE_SUM, QLINK_REDUCE_AVG, QLINK_REDUCE_SIGN}) {
    MakeBuffers(3000 + 11, 21);
    const std::vector<double> exact = ExactSum();
    qlink_all_reduce_args args{
        sizeof(qlink_all_reduce_args), dl_.data(), dl_.size(), op,
        QLINK_TRANSPORT_FP32,          nullptr,    0,          QLINK_ALL_REDUCE_HALVING_DOUBLING};
    ASSERT_EQ(api_.all_reduce(ctx_.get(), &args), QLINK_OK) << api_.last_error();
    const double div = op == QLINK_REDUCE_AVG ? world() : 1.0;
    for (int d = 0; d < world(); ++d) {
      ASSERT_EQ(std::memcmp(data_[d].data(), data_[0].data(), data_[0].size() * 4), 0) << "replica " << d;
    }
    for (size_t i = 0; i < exact.size(); ++i) {
      if (op == QLINK_REDUCE_SIGN) {
        if (std::abs(exact[i]) > 0.05) {
          ASSERT_EQ(data_[0][i], exact[i] > 0 ? 1.0f : -1.0f) << "element " << i;
        }
      } else {
        ASSERT_NEAR(data_[0][i], exact[i] / div, 1e-5 * (1 + std::abs(exact[i]))) << "element " << i;
      }
    }
  }
}

TEST_P(Collectives, AllReduceWithBf16TransportStaysWithinBf16Rounding) {
  MakeBuffers(4096, 12);
  std::vector<double> bound(data_[0].size(), 0.0);
  for (const auto& v : data_) {
    for (size_t i = 0; i < v.size(); ++i) bound[i] += std::abs(v[i]) * std::ldexp(1.0, -8);  // half a bf16 ulp each
  }
  const std::vector<double> exact = ExactSum();
  qlink_all_reduce_args args{
      QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), dl_.size(), QLINK_REDUCE_SUM, QLINK_TRANSPORT_BF16, nullptr, 0};
  ASSERT_EQ(api_.all_reduce(ctx_.get(), &args), QLINK_OK) << api_.last_error();
  for (int d = 0; d < world(); ++d) {
    EXPECT_EQ(data_[d], data_[0]);
    for (size_t i = 0; i < exact.size(); ++i) ASSERT_LE(std::abs(data_[d][i] - exact[i]), bound[i] + 1e-5);
  }
}

TEST_P(Collectives, SignCastLeavesEveryReplicaBitIdentical) {
  MakeBuffers(777, 13);
  const std::vector<double> exact = ExactSum();
  qlink_all_reduce_args args{
      QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), dl_.size(), QLINK_REDUCE_SIGN, QLINK_TRANSPORT_BF16, nullptr, 0};
  ASSERT_EQ(api_.all_reduce(ctx_.get(), &args), QLINK_OK) << api_.last_error();
  for (int d = 0; d < world(); ++d) {
    EXPECT_EQ(std::memcmp(data_[d].data(), data_[0].data(), data_[0].size() * 4), 0) << "replica " << d;
    for (size_t i = 0; i < exact.size(); ++i) {
      ASSERT_TRUE(data_[d][i] == 0.0f || data_[d][i] == 1.0f || data_[d][i] == -1.0f);
      if (std::abs(exact[i]) > 0.05) {
        ASSERT_EQ(data_[d][i], exact[i] > 0 ? 1.0f : -1.0f) << "element " << i;
      }
    }
  }
}

// A plan validated once, replayed over new contents: every replay equals a one-off
// all_reduce of the same data, bit for bit.
TEST_P(Collectives, AllReducePlanReplaysLikeAllReduce) {
  for (int32_t op : {QLINK_REDUCE_AVG, QLINK_REDUCE_SIGN}) {
    MakeBuffers(1500, 21);
    qlink_all_reduce_args args{
        QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), dl_.size(), op, QLINK_TRANSPORT_BF16, nullptr, 0};
    qlink_all_reduce_plan* plan = nullptr;
    ASSERT_EQ(api_.all_reduce_plan_create(ctx_.get(), &args, &plan), QLINK_OK) << api_.last_error();
    for (unsigned round = 0; round < 3; ++round) {
      std::mt19937 rng(100 + round);
      std::normal_distribution<float> normal;
      for (auto& v : data_) {
        for (auto& x : v) x = normal(rng);
      }
      const auto inputs = data_;
      ASSERT_EQ(api_.all_reduce_plan_execute(plan, nullptr, 0), QLINK_OK) << api_.last_error();
      const auto replayed = data_;
      data_ = inputs;
      Describe();
      qlink_all_reduce_args once{
          QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), dl_.size(), op, QLINK_TRANSPORT_BF16, nullptr, 0};
      ASSERT_EQ(api_.all_reduce(ctx_.get(), &once), QLINK_OK) << api_.last_error();
      EXPECT_EQ(replayed, data_) << "round " << round;
    }
    EXPECT_EQ(api_.all_reduce_plan_destroy(plan), QLINK_OK);
  }
}

TEST_P(Collectives, ReduceIsBitIdenticalForEveryArrivalOrder) {
  MakeBuffers(513, 14);
  if (world() >= 3) {  // partials whose sum cancels: only device order gives exactly 1
    data_[0][0] = 1e20f;
    data_[1][0] = -1e20f;
    data_[2][0] = 1.0f;
    for (int d = 3; d < world(); ++d) data_[d][0] = 0.0f;
  }
  std::vector<float> out(513, 0.0f), first;
  Tensor out_t(out.data(), out.size() * 4, kDLCPU, world() - 1, kF32);
  std::vector<int> perm(world());
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 24; ++trial) {
    std::vector<DLTensor> inputs;
    for (int k : perm) inputs.push_back(dl_[k]);
    qlink_reduce_args args{QLINK_REDUCE_ARGS_STRUCT_SIZE, inputs.data(), inputs.size(), &out_t.dl, 0.5, nullptr, 0};
    ASSERT_EQ(api_.reduce(ctx_.get(), &args), QLINK_OK) << api_.last_error();
    if (trial == 0) first = out;
    ASSERT_EQ(std::memcmp(out.data(), first.data(), out.size() * 4), 0) << "trial " << trial;
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  const std::vector<double> exact = ExactSum();
  if (world() >= 3) {
    EXPECT_EQ(out[0], 0.5f);  // (1e20 - 1e20 + 1) * 0.5, in device order
  }
  for (size_t i = 1; i < out.size(); ++i) ASSERT_NEAR(out[i], 0.5 * exact[i], 1e-5 * (1 + std::abs(exact[i])));
}

TEST_P(Collectives, ReduceInPlaceIntoAnInput) {
  MakeBuffers(300, 15);
  const std::vector<double> exact = ExactSum();
  qlink_reduce_args args{QLINK_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), dl_.size(), &dl_[0], 1.0, nullptr, 0};
  ASSERT_EQ(api_.reduce(ctx_.get(), &args), QLINK_OK) << api_.last_error();
  for (size_t i = 0; i < exact.size(); ++i) ASSERT_NEAR(data_[0][i], exact[i], 1e-5 * (1 + std::abs(exact[i])));
}

TEST_P(Collectives, BroadcastMirrorsEveryLeafToEveryReplica) {
  if (world() < 2) GTEST_SKIP() << "a broadcast needs a replica device";
  const std::vector<size_t> sizes = {1, 17, 4096, 100000};
  std::vector<std::vector<uint8_t>> src, dst;
  std::deque<Tensor> t;
  std::vector<DLTensor> s, d;
  std::mt19937 rng(3);
  for (size_t n : sizes) {
    src.emplace_back(n);
    for (auto& b : src.back()) b = static_cast<uint8_t>(rng());
    s.push_back(t.emplace_back(src.back().data(), n, kDLCPU, 0).dl);
  }
  for (int r = 1; r < world(); ++r) {
    for (size_t n : sizes) {
      dst.emplace_back(n, 0);
      d.push_back(t.emplace_back(dst.back().data(), n, kDLCPU, r).dl);
    }
  }
  qlink_broadcast_args args{
      sizeof(qlink_broadcast_args), s.data(), sizes.size(), d.data(), static_cast<size_t>(world() - 1), nullptr, 0, 8u};
  EXPECT_EQ(api_.broadcast(ctx_.get(), &args), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.flags = 8 has bits that are not qlink_copy_flags"));
  for (size_t k = 0; k < dst.size(); ++k) ASSERT_EQ(dst[k], std::vector<uint8_t>(dst[k].size(), 0)) << k;
  for (uint32_t flags : {0u, uint32_t{QLINK_COPY_SOURCES_READY | QLINK_COPY_SOURCES_HELD}, uint32_t{QLINK_COPY_WAIT}}) {
    for (auto& v : dst) std::fill(v.begin(), v.end(), 0);
    args.flags = flags;
    ASSERT_EQ(api_.broadcast(ctx_.get(), &args), QLINK_OK) << api_.last_error();
    for (size_t k = 0; k < dst.size(); ++k) EXPECT_EQ(dst[k], src[k % sizes.size()]) << "destination " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(World, Collectives, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

class CollectiveRefusals : public Collectives {
 protected:
  int world() const { return 3; }
};

TEST_F(CollectiveRefusals, NamesTheCulpritAndWritesNothing) {
  data_.assign(3, std::vector<float>(64, 1.0f));
  for (int d = 0; d < 3; ++d) dl_.push_back(tensors_.emplace_back(data_[d].data(), 256, kDLCPU, d, kF32).dl);
  const auto before = data_;
  auto all_reduce = [&](std::vector<DLTensor> b, int32_t op, int32_t transport) {
    qlink_all_reduce_args args{QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, b.data(), b.size(), op, transport, nullptr, 0};
    return api_.all_reduce(ctx_.get(), &args);
  };
  auto with = [&](int k, auto edit) {
    std::vector<DLTensor> b = dl_;
    edit(b[k]);
    return b;
  };
  EXPECT_EQ(all_reduce(with(1,
                            [](DLTensor& t) {
                              t.dtype = DLDataType{kDLBfloat, 16, 1};
                            }),
                       0, 0),
            QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("buffers[1]: dtype must be float32"));
  EXPECT_EQ(all_reduce(with(2, [](DLTensor& t) { t.device.device_id = 0; }), 0, 0), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("buffers[2] is on device 0 like buffers[0]"));
  static int64_t shorter = 32;
  EXPECT_EQ(all_reduce(with(2, [](DLTensor& t) { t.shape = &shorter; }), 0, 0), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("buffers[2] has 128 bytes but buffers[0] has 256"));
  EXPECT_EQ(all_reduce(dl_, 7, 0), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.op = 7"));
  {
    std::vector<DLTensor> b = with(1, [](DLTensor& t) { t.dtype = DLDataType{kDLBfloat, 16, 1}; });
    qlink_all_reduce_args args{QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, b.data(), b.size(), 0, 0, nullptr, 0};
    qlink_all_reduce_plan* plan = nullptr;
    EXPECT_EQ(api_.all_reduce_plan_create(ctx_.get(), &args, &plan), QLINK_INVALID_ARGUMENT);
    EXPECT_THAT(api_.last_error(), HasSubstr("buffers[1]: dtype must be float32"));
    EXPECT_EQ(plan, nullptr);
    EXPECT_EQ(api_.all_reduce_plan_execute(nullptr, nullptr, 0), QLINK_INVALID_ARGUMENT);
    EXPECT_THAT(api_.last_error(), HasSubstr("plan is NULL"));
    EXPECT_EQ(api_.all_reduce_plan_destroy(nullptr), QLINK_OK);
  }
  EXPECT_EQ(all_reduce(dl_, 0, 9), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.transport = 9"));
  qlink_all_reduce_args hd{sizeof(qlink_all_reduce_args), dl_.data(), 3, QLINK_REDUCE_SUM,
                           QLINK_TRANSPORT_FP32,          nullptr,    0, QLINK_ALL_REDUCE_HALVING_DOUBLING};
  EXPECT_EQ(api_.all_reduce(ctx_.get(), &hd), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("needs a power-of-two number of buffers, got 3"));
  hd.num_buffers = 2;
  hd.transport = QLINK_TRANSPORT_BF16;
  EXPECT_EQ(api_.all_reduce(ctx_.get(), &hd), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("use transport fp32"));
  hd.algorithm = 5;
  EXPECT_EQ(api_.all_reduce(ctx_.get(), &hd), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.algorithm = 5"));
  EXPECT_EQ(all_reduce(with(1, [&](DLTensor& t) { t.data = data_[0].data() + 8; }), 0, 0), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("buffers[1] overlaps buffers[0]"));

  std::vector<float> out(64, 0.0f);
  Tensor out_t(data_[1].data() + 3, 256, kDLCPU, 2, kF32);
  qlink_reduce_args r{QLINK_REDUCE_ARGS_STRUCT_SIZE, dl_.data(), 3, &out_t.dl, 1.0, nullptr, 0};
  EXPECT_EQ(api_.reduce(ctx_.get(), &r), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("output overlaps inputs[1]"));
  r.output = nullptr;
  EXPECT_EQ(api_.reduce(ctx_.get(), &r), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.output is NULL"));
  EXPECT_EQ(data_, before);
  EXPECT_EQ(out, std::vector<float>(64, 0.0f));

  qlink_broadcast_args bad{QLINK_BROADCAST_ARGS_STRUCT_SIZE, dl_.data(), 1, &dl_[0], 1, nullptr, 0};
  EXPECT_EQ(api_.broadcast(ctx_.get(), &bad), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("destinations[0] is on device 0, the root's"));
}

}  // namespace
}  // namespace qlink_test
