// One conformance suite for every behaviour of backends/device_backend.h, run against
// every backend library given: CPU, fault and the zero-device GPU backends in CI, the
// CUDA backend on the accelerator machine, HIP wherever an AMD GPU exists.
//
//   conformance_test [gtest flags] [--backend=PATH ...]   (default: every backend built)
#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/dll/shared_library.hpp>

#include "backends/cpu/cpu_kernels.h"
#include "backends/device_backend.h"
#include "tests/host/runfiles.h"

namespace qlink_test {
namespace {

using qlink::CopyLeaf;
using qlink::DeviceBackend;
using qlink::Status;

std::vector<std::string>& BackendPaths() {
  static std::vector<std::string> paths;
  return paths;
}

#define ASSERT_OK(expr)                                    \
  do {                                                     \
    const Status s_ = (expr);                              \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.message(); \
  } while (0)

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // Loaded once per process, as core does: GPU runtimes do not survive being unmapped.
    static auto* libraries = new std::map<std::string, boost::dll::shared_library>();
    boost::dll::shared_library& library_ = (*libraries)[GetParam()];
    if (!library_.is_loaded()) {
      library_.load(GetParam(), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    }
    ASSERT_EQ(library_.get<qlink_backend_version_fn>(QLINK_BACKEND_VERSION_SYMBOL)(), QLINK_BACKEND_INTERFACE_VERSION);
    create_ = &library_.get<qlink_backend_create_fn>(QLINK_BACKEND_CREATE_SYMBOL);
    qlink_backend_options options = Options();
    char error[256] = "";
    backend_.reset(create_(&options, error, sizeof(error)));
    ASSERT_NE(backend_, nullptr) << error;
  }
  static qlink_backend_options Options() {
    qlink_backend_options options{};
    options.struct_size = sizeof(options);
    options.virtual_devices = 3;
    options.options_json = "{}";
    options.blas_library = "";
    options.solver_library = "";
    return options;
  }
  void TearDown() override { backend_.reset(); }

  int devices() const { return backend_->device_count(); }
  // Host bytes of `bytes` at `p` on `device`.
  std::vector<uint8_t> Read(int device, const void* p, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    Status s = backend_->CopyToHost(device, out.data(), p, bytes);
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
  void* Upload(int device, const std::vector<uint8_t>& data) {
    void* p = nullptr;
    EXPECT_TRUE(backend_->Allocate(device, data.size(), &p).ok());
    EXPECT_TRUE(backend_->CopyFromHost(device, p, data.data(), data.size()).ok());
    allocations_.emplace_back(device, p);
    return p;
  }
  // Eight bytes per draw: byte-wise drawing dominated the suite's time under TSan.
  static std::vector<uint8_t> Random(size_t n, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t word = rng();
      std::memcpy(v.data() + i, &word, std::min<size_t>(8, n - i));
    }
    return v;
  }
  void Free() {
    for (auto& [d, p] : allocations_) backend_->Free(d, p);
    allocations_.clear();
  }

  qlink_backend_create_fn* create_ = nullptr;
  std::unique_ptr<DeviceBackend> backend_;
  std::vector<std::pair<int, void*>> allocations_;
};

TEST_P(Conformance, DescribesItself) {
  const std::string name = backend_->name();
  EXPECT_FALSE(name.empty());
  EXPECT_GE(devices(), 0);
  const DLDeviceType type = backend_->device_type();
  EXPECT_TRUE(type == kDLCPU || type == kDLCUDA || type == kDLROCM) << type;
  EXPECT_GT(backend_->PullCrossoverBytes(), 0u);
  for (int d = 0; d < devices(); ++d) {
    qlink::DeviceProperties p;
    ASSERT_OK(backend_->GetProperties(d, &p));
    EXPECT_FALSE(p.name.empty());
    EXPECT_GT(p.total_bytes, 0u);
    EXPECT_LE(p.free_bytes, p.total_bytes);
  }
}

// The factory checks the options struct's size itself and reports through the caller's
// buffer, truncated to its capacity.
TEST_P(Conformance, RefusesOptionsOfAnotherSize) {
  qlink_backend_options options = Options();
  options.struct_size = sizeof(options) - sizeof(const char*);
  char error[24];
  std::memset(error, 'x', sizeof(error));
  EXPECT_EQ(create_(&options, error, sizeof(error)), nullptr);
  const std::string message(error);  // NUL-terminated within the buffer
  EXPECT_EQ(message.size(), sizeof(error) - 1);
  EXPECT_EQ(message.rfind("options->struct_size", 0), 0u) << message;
}

TEST_P(Conformance, MakesDevicesCurrent) {
  for (int d = devices() - 1; d >= 0; --d) {
    backend_->MakeCurrent(d);
    EXPECT_TRUE(backend_->CurrentDevice() == d || backend_->device_type() == kDLCPU);
  }
}

TEST_P(Conformance, MemoryRoundTripsAndMemsets) {
  for (int d = 0; d < devices(); ++d) {
    const auto data = Random(100003, d);
    void* p = Upload(d, data);
    EXPECT_EQ(Read(d, p, data.size()), data);
    ASSERT_OK(backend_->Memset(d, p, 0x5a, 1000, nullptr));
    ASSERT_OK(backend_->SynchronizeStream(d, nullptr));
    EXPECT_TRUE(backend_->StreamIdle(d, nullptr));
    auto back = Read(d, p, data.size());
    EXPECT_EQ(std::count(back.begin(), back.begin() + 1000, 0x5a), 1000);
    EXPECT_TRUE(std::equal(back.begin() + 1000, back.end(), data.begin() + 1000));
  }
  Free();
}

// A host copy is complete when it returns: a copy enqueued right after it on a stream of
// the backend's own (non-blocking on a GPU) reads the new bytes. A runtime memcpy from
// pageable memory returns with its DMA still running on the legacy stream.
TEST_P(Conformance, HostCopiesAreCompleteForEveryStream) {
  for (int d = 0; d < devices(); ++d) {
    qlink::Stream stream = nullptr;
    ASSERT_OK(backend_->CreateStream(d, &stream));
    const size_t n = size_t{4} << 20;
    char* staged = static_cast<char*>(Upload(d, std::vector<uint8_t>(n, 0)));
    char* copy = static_cast<char*>(Upload(d, std::vector<uint8_t>(n, 0)));
    for (unsigned round = 0; round < 16; ++round) {
      const auto data = Random(n, 1000 + round + 100 * static_cast<unsigned>(d));
      ASSERT_OK(backend_->CopyFromHost(d, staged, data.data(), n));
      const CopyLeaf leaf{staged, copy, n};
      ASSERT_OK(backend_->CopyLeaves(d, d, &leaf, 1, stream));
      ASSERT_OK(backend_->SynchronizeStream(d, stream));
      ASSERT_EQ(Read(d, copy, n), data) << "device " << d << " round " << round;
    }
    backend_->DestroyStream(d, stream);
    Free();
  }
}

TEST_P(Conformance, PeerAccessIsJudgedPerOrderedPairAndIdempotent) {
  for (int a = 0; a < devices(); ++a) {
    for (int b = 0; b < devices(); ++b) {
      if (a == b || !backend_->HasPeerAccess()) continue;
      bool can = false;
      ASSERT_OK(backend_->CanAccessPeer(a, b, &can));
      if (!can) continue;
      ASSERT_OK(backend_->EnablePeerAccess(a, b));
      ASSERT_OK(backend_->EnablePeerAccess(a, b));  // already enabled is success
    }
  }
}

// Copies of odd sizes at unaligned offsets, every ordered pair, both copy paths; an event
// orders the producer (memset on the source's own stream) before the copy.
TEST_P(Conformance, CopiesAreByteExactAndOrderedByEvents) {
  std::vector<std::pair<int, int>> pairs;
  for (int s = 0; s < devices(); ++s) {
    for (int d = 0; d < devices(); ++d) {
      bool can = s == d || !backend_->HasPeerAccess();
      if (!can) ASSERT_OK(backend_->CanAccessPeer(d, s, &can));
      if (can && s != d && backend_->HasPeerAccess()) ASSERT_OK(backend_->EnablePeerAccess(d, s));
      pairs.emplace_back(s, d);
    }
  }
  const std::vector<std::pair<size_t, size_t>> shapes = {{1, 0}, {17, 3}, {4096, 0}, {65537, 7}, {1 << 20, 16}};
  for (auto [s, d] : pairs) {
    qlink::Stream src_stream = nullptr, dst_stream = nullptr;
    qlink::Event ready = nullptr;
    ASSERT_OK(backend_->CreateStream(s, &src_stream));
    ASSERT_OK(backend_->CreateStream(d, &dst_stream));
    ASSERT_OK(backend_->CreateEvent(s, &ready));
    for (const char* path : {"pull", "prepared pull", "runtime"}) {
      const bool pull = std::string(path) != "runtime";
      if (pull && s != d && backend_->HasPeerAccess()) {
        bool can = false;
        ASSERT_OK(backend_->CanAccessPeer(d, s, &can));
        if (!can) continue;
      }
      std::vector<CopyLeaf> leaves;
      std::vector<std::vector<uint8_t>> expected;
      for (size_t k = 0; k < shapes.size(); ++k) {
        auto [n, off] = shapes[k];
        auto data = Random(n + off, static_cast<unsigned>(k + 10 * s + 100 * d));
        char* from = static_cast<char*>(Upload(s, data));
        char* to = static_cast<char*>(Upload(d, std::vector<uint8_t>(n + 32, 0)));
        // The producer: overwrite the source on its own stream, then the event.
        ASSERT_OK(backend_->Memset(s, from + off, static_cast<int>(k + 1), n / 2, src_stream));
        std::fill(data.begin() + off, data.begin() + off + n / 2, static_cast<uint8_t>(k + 1));
        leaves.push_back(CopyLeaf{from + off, to + 5, n});
        expected.emplace_back(data.begin() + off, data.end());
      }
      ASSERT_OK(backend_->RecordEvent(s, ready, src_stream));
      ASSERT_OK(backend_->StreamWaitEvent(d, dst_stream, ready));
      std::unique_ptr<qlink::PreparedPull> prepared;
      if (std::string(path) == "prepared pull") {
        ASSERT_OK(backend_->PreparePull(d, leaves.data(), leaves.size(), &prepared));
        ASSERT_OK(prepared->Launch(dst_stream));
      } else {
        ASSERT_OK(pull ? backend_->PullLeaves(d, leaves.data(), leaves.size(), dst_stream)
                       : backend_->CopyLeaves(d, s, leaves.data(), leaves.size(), dst_stream));
      }
      ASSERT_OK(backend_->SynchronizeStream(d, dst_stream));
      prepared.reset();
      for (size_t k = 0; k < leaves.size(); ++k) {
        auto got = Read(d, static_cast<char*>(leaves[k].dst) - 5, leaves[k].bytes + 32);
        EXPECT_TRUE(std::all_of(got.begin(), got.begin() + 5, [](uint8_t b) { return b == 0; }));
        EXPECT_TRUE(std::equal(expected[k].begin(), expected[k].end(), got.begin() + 5))
            << path << " copy " << s << "->" << d << " leaf " << k;
        EXPECT_TRUE(std::all_of(got.begin() + 5 + leaves[k].bytes, got.end(), [](uint8_t b) { return b == 0; }));
      }
      Free();
    }
    ASSERT_OK(backend_->SynchronizeStream(s, src_stream));
    backend_->DestroyEvent(s, ready);
    backend_->DestroyStream(d, dst_stream);
    backend_->DestroyStream(s, src_stream);
  }
}

// The collective kernels agree bit for bit with the host reference (same summation order).
TEST_P(Conformance, CollectiveKernelsMatchTheHostReference) {
  if (devices() == 0) GTEST_SKIP() << "no devices";
  const size_t n = 10007;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> parts(3, std::vector<float>(n));
  for (auto& p : parts) {
    for (auto& x : p) x = normal(rng);
  }
  std::vector<const void*> host_in, dev_in;
  for (auto& p : parts) {
    host_in.push_back(p.data());
    std::vector<uint8_t> bytes(n * 4);
    std::memcpy(bytes.data(), p.data(), bytes.size());
    dev_in.push_back(Upload(0, bytes));
  }
  void* out = Upload(0, std::vector<uint8_t>(n * 4, 0));
  void* half = Upload(0, std::vector<uint8_t>(n * 2, 0));
  for (bool signs : {false, true}) {
    std::vector<uint8_t> want(n * 4, 0);
    qlink::cpu::ReduceSum(want.data(), host_in.data(), 3, false, n, 0.25f, signs);
    ASSERT_OK(backend_->ReduceSum(0, out, dev_in.data(), 3, false, n, 0.25f, signs, nullptr));
    ASSERT_OK(backend_->SynchronizeStream(0, nullptr));
    const size_t bytes = signs ? n : n * 4;
    auto got = Read(0, out, bytes);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << (signs ? "signs" : "sums");
  }
  std::vector<uint16_t> want_half(n);
  qlink::cpu::CastToBf16(want_half.data(), parts[0].data(), n);
  ASSERT_OK(backend_->CastToBf16(0, static_cast<uint16_t*>(half), static_cast<const float*>(dev_in[0]), n, nullptr));
  ASSERT_OK(backend_->SynchronizeStream(0, nullptr));
  auto got_half = Read(0, half, n * 2);
  EXPECT_EQ(std::memcmp(got_half.data(), want_half.data(), n * 2), 0);
  std::vector<uint8_t> signs(n);
  for (size_t i = 0; i < n; ++i) signs[i] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(i % 3) - 1));
  void* dev_signs = Upload(0, signs);
  ASSERT_OK(backend_->ExpandSigns(0, static_cast<float*>(out), static_cast<const int8_t*>(dev_signs), n, nullptr));
  ASSERT_OK(backend_->SynchronizeStream(0, nullptr));
  auto expanded = Read(0, out, n * 4);
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, expanded.data() + 4 * i, 4);
    ASSERT_EQ(f, static_cast<float>(static_cast<int>(i % 3) - 1)) << i;
  }
  Free();
}

std::string Label(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(info.param.find_last_of('/') + 1);
  name = name.substr(0, name.find('.'));
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(BackendPaths()), Label);

}  // namespace
}  // namespace qlink_test

int main(int argc, char** argv) {
  // Before InitGoogleTest: that is when parameterized suites take their values.
  auto& paths = qlink_test::BackendPaths();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--backend=", 0) == 0) paths.push_back(arg.substr(10));
  }
  if (paths.empty()) {
    for (const char* name : {"cpu", "fault", "cuda", "hip"}) {
      const std::string path = qlink_test::RunfilePath(std::string("libqlink_backend_") + name + ".so");
      if (std::ifstream(path).good()) paths.push_back(path);
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
