// A host built against the frozen 1.0 header (not plugin_api/qlink.h) running on the
// current libqlink.so: it negotiates 1.0, creates a context and copies a batch.
#include <dlfcn.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/abi_fixture/qlink_1_0.h"
#include "tests/host/runfiles.h"

namespace {

class Host10 : public ::testing::Test {
 protected:
  void SetUp() override {
    library_ = dlopen(qlink_test::RunfilePath("libqlink.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
    auto get_api = reinterpret_cast<qlink_get_api_fn>(dlsym(library_, "qlink_get_api"));
    ASSERT_NE(get_api, nullptr);
    const char* error = nullptr;
    api_ = get_api(1, 0, &error);
    ASSERT_NE(api_, nullptr) << error;
  }
  void TearDown() override {
    if (library_ != nullptr) dlclose(library_);
  }

  void* library_ = nullptr;
  const qlink_api* api_ = nullptr;
};

TEST_F(Host10, NegotiatesOneZeroAndCopiesABatch) {
  EXPECT_EQ(api_->abi_major, 1u);
  EXPECT_GE(api_->abi_minor, 0u);
  EXPECT_GE(api_->struct_size, QLINK_API_STRUCT_SIZE_1_0);

  qlink_context* ctx = nullptr;
  ASSERT_EQ(api_->context_create(R"({"backend": "cpu", "cpu_devices": 2, "log_level": "off"})", &ctx), QLINK_OK)
      << api_->last_error();
  qlink_device_info info;
  std::memset(&info, 0xee, sizeof(info));
  info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
  ASSERT_EQ(api_->device_info(ctx, 1, &info), QLINK_OK) << api_->last_error();
  EXPECT_EQ(info.struct_size, QLINK_DEVICE_INFO_STRUCT_SIZE);
  EXPECT_STREQ(info.name, "cpu:virtual:1");

  std::vector<uint32_t> a(1000), b(1000, 0);
  std::iota(a.begin(), a.end(), 7u);
  int64_t shape = 1000;
  DLTensor src{a.data(), {kDLCPU, 0}, 1, {kDLUInt, 32, 1}, &shape, nullptr, 0};
  DLTensor dst{b.data(), {kDLCPU, 1}, 1, {kDLUInt, 32, 1}, &shape, nullptr, 0};
  qlink_stream streams[] = {{{kDLCPU, 0}, nullptr}, {{kDLCPU, 1}, nullptr}};
  qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, &src, &dst, 1, streams, 2};
  ASSERT_EQ(api_->copy_batch(ctx, &args), QLINK_OK) << api_->last_error();
  ASSERT_EQ(api_->stream_synchronize(ctx, 1, nullptr), QLINK_OK);
  EXPECT_EQ(a, b);

  qlink_peer_info peer{};
  peer.struct_size = QLINK_PEER_INFO_STRUCT_SIZE;
  ASSERT_EQ(api_->peer_info(ctx, 0, 1, &peer), QLINK_OK) << api_->last_error();
  EXPECT_EQ(peer.state, QLINK_PEER_NOT_APPLICABLE);
  EXPECT_EQ(api_->context_destroy(ctx), QLINK_OK);
}

}  // namespace
