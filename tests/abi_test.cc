// The C ABI as a host sees it: libqlink.so dlopen'ed, never linked.
#include <dlfcn.h>

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

constexpr char kCpu4[] = R"({"backend": "cpu", "cpu_devices": 4, "log_level": "off"})";

TEST(Abi, NegotiatesTheBuiltVersion) {
  Plugin plugin;
  EXPECT_EQ(plugin.api().abi_major, QLINK_ABI_MAJOR);
  EXPECT_EQ(plugin.api().abi_minor, QLINK_ABI_MINOR);
  EXPECT_GE(plugin.api().struct_size, QLINK_API_STRUCT_SIZE_1_0);
}

TEST(Abi, RefusesAnotherMajorNamingBothVersions) {
  Plugin plugin;
  const char* error = nullptr;
  EXPECT_EQ(plugin.get_api()(QLINK_ABI_MAJOR + 1, 0, &error), nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_THAT(error,
              HasSubstr("provides ABI " + std::to_string(QLINK_ABI_MAJOR) + "." + std::to_string(QLINK_ABI_MINOR)));
  EXPECT_THAT(error, HasSubstr("asked for 2.0"));
  EXPECT_THAT(error, HasSubstr("major"));
}

TEST(Abi, RefusesATooNewMinor) {
  Plugin plugin;
  const char* error = nullptr;
  EXPECT_EQ(plugin.get_api()(QLINK_ABI_MAJOR, QLINK_ABI_MINOR + 1, &error), nullptr);
  EXPECT_THAT(error, HasSubstr("minor too new"));
  EXPECT_EQ(plugin.get_api()(QLINK_ABI_MAJOR, QLINK_ABI_MINOR + 1, nullptr), nullptr);  // error is optional
}

TEST(Abi, ExportsOnlyTheBootstrapSymbol) {
  void* handle = dlopen(RunfilePath("libqlink.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr);
  EXPECT_NE(dlsym(handle, "qlink_get_api"), nullptr);
  for (const char* hidden : {"_ZN5qlink11ParseConfigEPKcPNS_6ConfigE", "ContextCreate", "qlink_backend_create"}) {
    EXPECT_EQ(dlsym(handle, hidden), nullptr) << hidden;
  }
  dlclose(handle);
}

class CpuContext : public ::testing::Test {
 protected:
  Plugin plugin_;
  const qlink_api& api_ = plugin_.api();
  Context ctx_{plugin_, kCpu4};

  std::string LastError() const { return api_.last_error(); }
};

TEST_F(CpuContext, ReportsFourVirtualDevicesWithoutPeerPairs) {
  ASSERT_EQ(ctx_.status(), QLINK_OK) << LastError();
  const char* name = nullptr;
  ASSERT_EQ(api_.backend_name(ctx_.get(), &name), QLINK_OK);
  EXPECT_STREQ(name, "cpu");
  int32_t count = 0;
  ASSERT_EQ(api_.device_count(ctx_.get(), &count), QLINK_OK);
  EXPECT_EQ(count, 4);
  qlink_device_info info{};
  info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
  ASSERT_EQ(api_.device_info(ctx_.get(), 2, &info), QLINK_OK);
  EXPECT_STREQ(info.name, "cpu:virtual:2");
  EXPECT_EQ(info.device.device_type, kDLCPU);
  EXPECT_GT(info.total_bytes, 0u);

  const int32_t all[] = {0, 1, 2, 3};
  ASSERT_EQ(api_.enable_peer_access(ctx_.get(), all, 4), QLINK_OK);
  qlink_peer_info peer{};
  peer.struct_size = QLINK_PEER_INFO_STRUCT_SIZE;
  ASSERT_EQ(api_.peer_info(ctx_.get(), 0, 3, &peer), QLINK_OK);
  EXPECT_EQ(peer.state, QLINK_PEER_NOT_APPLICABLE);
  EXPECT_THAT(peer.reason, HasSubstr("no peer access"));
}

TEST_F(CpuContext, CopiesABatchBetweenVirtualDevicesByteExact) {
  ASSERT_EQ(ctx_.status(), QLINK_OK) << LastError();
  std::mt19937 rng(7);
  const std::vector<size_t> sizes = {1, 17, 4096, 65536 + 3, 1 << 20};
  std::vector<std::vector<uint8_t>> src, dst;
  std::deque<Tensor> tensors;
  std::vector<DLTensor> sources, destinations;
  for (size_t i = 0; i < sizes.size() * 3; ++i) {
    const size_t n = sizes[i % sizes.size()];
    src.emplace_back(n);
    dst.emplace_back(n, 0);
    for (auto& b : src.back()) b = static_cast<uint8_t>(rng());
    const int from = static_cast<int>(i % 4), to = static_cast<int>((i + 1 + i / 5) % 4);
    sources.push_back(tensors.emplace_back(src.back().data(), n, kDLCPU, from).dl);
    destinations.push_back(tensors.emplace_back(dst.back().data(), n, kDLCPU, to).dl);
  }
  qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, sources.data(), destinations.data(), sources.size(), nullptr, 0};
  ASSERT_EQ(api_.copy_batch(ctx_.get(), &args), QLINK_OK) << LastError();
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(src[i], dst[i]) << "leaf " << i;
}

TEST_F(CpuContext, ReplaysAPreparedPlanAfterTheSourcesChange) {
  ASSERT_EQ(ctx_.status(), QLINK_OK) << LastError();
  std::vector<float> a(1000), b(1000, 0.0f);
  std::iota(a.begin(), a.end(), 0.0f);
  Tensor s(a.data(), a.size() * 4, kDLCPU, 1, {kDLFloat, 32, 1});
  Tensor d(b.data(), b.size() * 4, kDLCPU, 3, {kDLFloat, 32, 1});
  qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, &s.dl, &d.dl, 1, nullptr, 0};
  qlink_copy_plan* plan = nullptr;
  ASSERT_EQ(api_.copy_plan_create(ctx_.get(), &args, &plan), QLINK_OK) << LastError();
  EXPECT_EQ(b[999], 0.0f);  // creating a plan copies nothing
  for (int round = 0; round < 3; ++round) {
    for (auto& x : a) x += 1.0f;
    ASSERT_EQ(api_.copy_plan_execute(plan, nullptr, 0), QLINK_OK) << LastError();
    EXPECT_EQ(a, b);
  }
  EXPECT_EQ(api_.copy_plan_destroy(plan), QLINK_OK);
}

TEST_F(CpuContext, MemoryRoundTripsThroughTheHost) {
  ASSERT_EQ(ctx_.status(), QLINK_OK) << LastError();
  void* p = nullptr;
  ASSERT_EQ(api_.memory_allocate(ctx_.get(), 1, 4096, &p), QLINK_OK);
  std::vector<uint8_t> in(4096), out(4096, 0);
  std::iota(in.begin(), in.end(), 0);
  ASSERT_EQ(api_.memory_from_host(ctx_.get(), 1, p, in.data(), in.size()), QLINK_OK);
  ASSERT_EQ(api_.memory_to_host(ctx_.get(), 1, out.data(), p, out.size()), QLINK_OK);
  EXPECT_EQ(in, out);
  EXPECT_EQ(api_.stream_synchronize(ctx_.get(), 1, nullptr), QLINK_OK);
  EXPECT_EQ(api_.memory_free(ctx_.get(), 1, p), QLINK_OK);
}

}  // namespace
}  // namespace qlink_test
