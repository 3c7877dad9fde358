// Every refusal returns a status and a message naming the culprit, and a refused batch
// writes no destination.
#include <deque>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/host/plugin.h"

namespace qlink_test {
namespace {

using ::testing::HasSubstr;

class Refusals : public ::testing::Test {
 protected:
  // Creating a context with `config` must fail with `code` and a message containing `culprit`.
  void ExpectConfigRefused(const std::string& config, qlink_status code, const std::string& culprit) {
    qlink_context* ctx = reinterpret_cast<qlink_context*>(0x1);
    EXPECT_EQ(api_.context_create(config.c_str(), &ctx), code) << config;
    EXPECT_EQ(ctx, nullptr);
    EXPECT_THAT(api_.last_error(), HasSubstr(culprit)) << config;
  }

  Plugin plugin_;
  const qlink_api& api_ = plugin_.api();
};

TEST_F(Refusals, BadJson) {
  ExpectConfigRefused(R"({"backend": "cpu",)", QLINK_INVALID_ARGUMENT, "not valid JSON");
  ExpectConfigRefused("[1, 2]", QLINK_INVALID_ARGUMENT, "must be a JSON object");
}

TEST_F(Refusals, UnknownKeys) {
  ExpectConfigRefused(R"({"backnd": "cpu"})", QLINK_INVALID_ARGUMENT, "unknown field 'backnd'");
  ExpectConfigRefused(R"({"p2p": {"mode": "on", "use_torch_replicate": true}})", QLINK_INVALID_ARGUMENT,
                      "unknown field 'p2p.use_torch_replicate'");
}

TEST_F(Refusals, WrongTypes) {
  ExpectConfigRefused(R"({"cpu_devices": "4"})", QLINK_INVALID_ARGUMENT, "'cpu_devices' must be an integer");
  ExpectConfigRefused(R"({"p2p": {"probe": 1}})", QLINK_INVALID_ARGUMENT, "'p2p.probe' must be a boolean");
  ExpectConfigRefused(R"({"p2p": {"min_gbps": "fast"}})", QLINK_INVALID_ARGUMENT, "'p2p.min_gbps' must be a number");
  ExpectConfigRefused(R"({"p2p": []})", QLINK_INVALID_ARGUMENT, "'p2p' must be an object");
  ExpectConfigRefused(R"({"backend": 3})", QLINK_INVALID_ARGUMENT, "'backend' must be a string");
  ExpectConfigRefused(R"({"backend_options": "slow"})", QLINK_INVALID_ARGUMENT, "'backend_options' must be an object");
  ExpectConfigRefused(R"({"blas_library": 1})", QLINK_INVALID_ARGUMENT, "'blas_library' must be a string");
  ExpectConfigRefused(R"({"solver_library": null})", QLINK_INVALID_ARGUMENT, "'solver_library' must be a string");
}

TEST_F(Refusals, OutOfRange) {
  ExpectConfigRefused(R"({"cpu_devices": 0})", QLINK_INVALID_ARGUMENT, "'cpu_devices' = 0 is out of range");
  ExpectConfigRefused(R"({"cpu_devices": 100000000000})", QLINK_INVALID_ARGUMENT, "'cpu_devices'");
  ExpectConfigRefused(R"({"p2p": {"probe_mib": 0}})", QLINK_INVALID_ARGUMENT, "'p2p.probe_mib' = 0");
  ExpectConfigRefused(R"({"p2p": {"min_ratio": -1}})", QLINK_INVALID_ARGUMENT, "'p2p.min_ratio'");
  ExpectConfigRefused(R"({"p2p": {"mode": "sometimes"}})", QLINK_INVALID_ARGUMENT,
                      "'p2p.mode' = \"sometimes\" is not one of: auto, on, off");
  ExpectConfigRefused(R"({"log_level": "loud"})", QLINK_INVALID_ARGUMENT, "'log_level'");
}

TEST_F(Refusals, BackendPathThatDoesNotExist) {
  ExpectConfigRefused(R"({"backend": "/nonexistent/libqlink_backend_x.so"})", QLINK_UNAVAILABLE,
                      "'/nonexistent/libqlink_backend_x.so' cannot be loaded");
}

TEST_F(Refusals, BackendPathWithoutTheEntryPoint) {
  const std::string config = R"({"backend": ")" + RunfilePath("libqlink.so") + R"("})";
  ExpectConfigRefused(config, QLINK_UNAVAILABLE, "does not export qlink_backend_interface_version");
}

TEST_F(Refusals, NullPointers) {
  EXPECT_EQ(api_.context_create("{}", nullptr), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("out is NULL"));
  int32_t count = 0;
  EXPECT_EQ(api_.device_count(nullptr, &count), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("ctx is NULL"));
  EXPECT_EQ(api_.context_destroy(nullptr), QLINK_OK);
  EXPECT_EQ(api_.copy_plan_destroy(nullptr), QLINK_OK);

  Context ctx(plugin_, R"({"backend": "cpu", "log_level": "off"})");
  ASSERT_EQ(ctx.status(), QLINK_OK);
  EXPECT_EQ(api_.copy_batch(ctx.get(), nullptr), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args is NULL"));
  qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, nullptr, nullptr, 2, nullptr, 0};
  EXPECT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.sources is NULL"));
  EXPECT_EQ(api_.device_info(ctx.get(), 0, nullptr), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("info is NULL"));
  EXPECT_EQ(api_.enable_peer_access(ctx.get(), nullptr, 2), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("devices is NULL"));

  uint8_t a = 1, b = 2;
  Tensor s(&a, 1, kDLCPU, 0), d(&b, 1, kDLCPU, 1);
  s.dl.data = nullptr;
  qlink_copy_args one{QLINK_COPY_ARGS_STRUCT_SIZE, &s.dl, &d.dl, 1, nullptr, 0};
  EXPECT_EQ(api_.copy_batch(ctx.get(), &one), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("sources[0]: data is NULL"));
  EXPECT_EQ(b, 2);
}

TEST_F(Refusals, SuccessClearsTheLastError) {
  EXPECT_EQ(api_.device_count(nullptr, nullptr), QLINK_INVALID_ARGUMENT);
  EXPECT_STRNE(api_.last_error(), "");
  Context ctx(plugin_, R"({"backend": "cpu", "log_level": "off"})");
  EXPECT_STREQ(api_.last_error(), "");
}

TEST_F(Refusals, VersionedStructsTooSmall) {
  Context ctx(plugin_, R"({"backend": "cpu", "log_level": "off"})");
  qlink_device_info info{};
  info.struct_size = sizeof(size_t);
  EXPECT_EQ(api_.device_info(ctx.get(), 0, &info), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("info->struct_size 8 is below"));
  qlink_copy_args args{4, nullptr, nullptr, 0, nullptr, 0};
  EXPECT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args->struct_size 4"));
}

// A batch whose leaf `bad` is broken by `spoil`: refused with `culprit`, no destination written.
class RefusedBatch : public Refusals {
 protected:
  void SetUp() override { ASSERT_EQ(ctx_.status(), QLINK_OK); }

  template <typename Spoil>
  void Expect(Spoil spoil, const std::string& culprit) {
    constexpr int kLeaves = 8;
    std::vector<std::vector<uint8_t>> src(kLeaves, std::vector<uint8_t>(64, 0xab));
    std::vector<std::vector<uint8_t>> dst(kLeaves, std::vector<uint8_t>(64, 0x00));
    std::deque<Tensor> tensors;
    std::vector<DLTensor> s, d;
    for (int i = 0; i < kLeaves; ++i) {
      s.push_back(tensors.emplace_back(src[i].data(), 64, kDLCPU, i % 2).dl);
      d.push_back(tensors.emplace_back(dst[i].data(), 64, kDLCPU, (i + 1) % 2).dl);
    }
    spoil(s, d, dst);
    qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, s.data(), d.data(), s.size(), nullptr, 0};
    EXPECT_EQ(api_.copy_batch(ctx_.get(), &args), QLINK_INVALID_ARGUMENT);
    EXPECT_THAT(api_.last_error(), HasSubstr(culprit));
    for (int i = 0; i < kLeaves; ++i) {
      EXPECT_EQ(dst[i], std::vector<uint8_t>(64, 0x00)) << "destination " << i << " was written";
    }
    qlink_copy_plan* plan = nullptr;
    EXPECT_EQ(api_.copy_plan_create(ctx_.get(), &args, &plan), QLINK_INVALID_ARGUMENT);
    EXPECT_EQ(plan, nullptr);
  }

  Context ctx_{plugin_, R"({"backend": "cpu", "cpu_devices": 2, "log_level": "off"})"};
};

using Leaves = std::vector<DLTensor>;
using Buffers = std::vector<std::vector<uint8_t>>;

TEST_F(RefusedBatch, DeviceTheContextDoesNotHave) {
  Expect([](Leaves&, Leaves& d, Buffers&) { d[5].device.device_id = 2; },
         "destinations[5]: device id 2 does not exist (the context has 2 device(s))");
}

TEST_F(RefusedBatch, DeviceOfAnotherType) {
  Expect([](Leaves& s, Leaves&, Buffers&) { s[6].device.device_type = kDLCUDA; },
         "sources[6]: device type 2 (cuda) is not the context's cpu");
}

TEST_F(RefusedBatch, UnequalByteSizes) {
  static int64_t shorter = 32;
  Expect([](Leaves&, Leaves& d, Buffers&) { d[7].shape = &shorter; },
         "destinations[7] has 32 bytes but sources[7] has 64");
}

TEST_F(RefusedBatch, NonContiguous) {
  static int64_t shape[2] = {8, 8};
  static int64_t strides[2] = {1, 8};  // a transpose
  Expect(
      [](Leaves& s, Leaves&, Buffers&) {
        s[4].ndim = 2;
        s[4].shape = shape;
        s[4].strides = strides;
      },
      "sources[4]: not contiguous");
}

TEST_F(RefusedBatch, OverlappingDestinations) {
  Expect([](Leaves&, Leaves& d, Buffers& dst) { d[6].data = dst[2].data() + 10; },
         "destinations[2] overlaps destinations[6]");
}

TEST_F(RefusedBatch, DestinationOverlappingASource) {
  Expect([](Leaves& s, Leaves& d, Buffers&) { d[3].data = s[1].data; }, "destinations[3] overlaps sources[1]");
}

TEST_F(RefusedBatch, BadDtype) {
  Expect(
      [](Leaves& s, Leaves&, Buffers&) {
        s[0].dtype = DLDataType{kDLInt, 4, 1};
      },
      "sources[0]: dtype of 4 bits x 1 lanes is not a whole number of bytes");
}

TEST_F(RefusedBatch, StreamOfAnUnknownDevice) {
  Plugin& plugin = plugin_;
  (void)plugin;
  std::vector<uint8_t> a(8, 1), b(8, 0);
  Tensor s(a.data(), 8, kDLCPU, 0), d(b.data(), 8, kDLCPU, 1);
  qlink_stream streams[] = {{{kDLCPU, 0}, nullptr}, {{kDLCPU, 9}, nullptr}};
  qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, &s.dl, &d.dl, 1, streams, 2};
  EXPECT_EQ(api_.copy_batch(ctx_.get(), &args), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("streams[1]: device (type 1, id 9) is not a device of the context"));
  EXPECT_EQ(b, std::vector<uint8_t>(8, 0));
}

TEST_F(RefusedBatch, UnknownCopyFlags) {
  std::vector<uint8_t> a(8, 1), b(8, 0);
  Tensor s(a.data(), 8, kDLCPU, 0), d(b.data(), 8, kDLCPU, 1);
  qlink_copy_args args{sizeof(qlink_copy_args), &s.dl, &d.dl, 1, nullptr, 0, QLINK_COPY_SOURCES_HELD | 8u};
  EXPECT_EQ(api_.copy_batch(ctx_.get(), &args), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("args.flags = 10 has bits that are not qlink_copy_flags"));
  EXPECT_EQ(b, std::vector<uint8_t>(8, 0));
  // A 1.0/1.1 host's struct ends before the field: whatever follows it is not read.
  args.struct_size = QLINK_COPY_ARGS_STRUCT_SIZE_1_0;
  EXPECT_EQ(api_.copy_batch(ctx_.get(), &args), QLINK_OK) << api_.last_error();
  EXPECT_EQ(b, a);
}

TEST_F(RefusedBatch, PeerAccessForAnUnknownOrRepeatedDevice) {
  const int32_t unknown[] = {0, 5};
  EXPECT_EQ(api_.enable_peer_access(ctx_.get(), unknown, 2), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("devices[1] = 5 does not exist"));
  const int32_t repeated[] = {1, 1};
  EXPECT_EQ(api_.enable_peer_access(ctx_.get(), repeated, 2), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(api_.last_error(), HasSubstr("devices[1] = 1 is listed twice"));
}

}  // namespace
}  // namespace qlink_test
