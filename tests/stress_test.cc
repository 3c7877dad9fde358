// Many host threads on one context through the dlopen'ed ABI: mixed copies (checked byte
// for byte), prepared plans, topology queries, peer enabling, refused batches, and
// contexts created and destroyed alongside. Run under the sanitizers too. Every buffer
// is device memory taken through the ABI, so the same test runs on any backend:
//   stress_test [--config=JSON]   (default: the CPU backend with 4 virtual devices)
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/host/plugin.h"

namespace qlink_test {
namespace {

constexpr int kThreads = 32;
constexpr int kOpsPerThread = 10000;
constexpr size_t kMaxLeaf = 4096;
constexpr int kMaxLeaves = 4;

std::string& ConfigJson() {
  static std::string config = R"({"backend": "cpu", "cpu_devices": 4, "log_level": "off"})";
  return config;
}

enum Op { kCopyBatch, kCopyPlan, kQueries, kEnablePeers, kRefusedBatch, kMemory, kNewContext, kNumOps };
const char* const kOpNames[kNumOps] = {"copy_batch",         "copy_plan", "peer_info+device_info", "enable_peer_access",
                                       "refused copy_batch", "memory",    "context create+destroy"};

// Collects what went wrong across threads; the test reports the first few.
class Failures {
 public:
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.size() < 5) first_.push_back(what);
    ++count_;
  }
  int count() const { return count_; }
  std::string first() const {
    std::string all;
    for (const auto& f : first_) all += f + "\n";
    return all;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> first_;
  int count_ = 0;
};

class Worker {
 public:
  Worker(const qlink_api& api, qlink_context* ctx, int id, Failures& failures)
      : api_(api), ctx_(ctx), id_(id), rng_(1234 + id), failures_(failures) {
    api_.device_count(ctx_, &devices_);
    qlink_device_info info{};
    info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
    api_.device_info(ctx_, 0, &info);
    type_ = static_cast<DLDeviceType>(info.device.device_type);
    // Per device: kMaxLeaves source slots, then kMaxLeaves destination slots.
    for (int d = 0; d < devices_; ++d) {
      void* p = nullptr;
      Check(api_.memory_allocate(ctx_, d, 2 * kMaxLeaves * kMaxLeaf, &p), QLINK_OK, "memory_allocate arena");
      arenas_.push_back(static_cast<uint8_t*>(p));
    }
  }
  ~Worker() {
    for (int d = 0; d < devices_; ++d) api_.memory_free(ctx_, d, arenas_[d]);
  }

  void Run(std::array<std::atomic<int>, kNumOps>& done) {
    for (int i = 0; i < kOpsPerThread; ++i) {
      // One thread in eight also creates contexts, now and then: loading a backend is slow.
      Op op = static_cast<Op>(rng_() % (kNumOps - 1));
      if (id_ % 8 == 0 && rng_() % 64 == 0) op = kNewContext;
      if (Do(op)) done[op].fetch_add(1);
    }
  }

 private:
  bool Check(qlink_status got, qlink_status want, const char* what) {
    if (got == want) return true;
    failures_.Add("thread " + std::to_string(id_) + ": " + what + " returned " + std::to_string(got) + ": " +
                  api_.last_error());
    return false;
  }

  int Device() { return static_cast<int>(rng_() % devices_); }

  // Bytes that differ per buffer and per position, cheaply: a byte drawn per byte would
  // cost more than the calls under test.
  void Scribble(std::vector<uint8_t>* bytes) {
    const uint32_t seed = rng_();
    for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = static_cast<uint8_t>(seed + i * 167 + (i >> 8));
  }

  // A random batch of 1-4 leaves of 1-4096 bytes in this thread's arenas: sources
  // uploaded, destinations zeroed, the expected bytes kept on the host.
  struct Leaf {
    int src_device, dst_device;
    uint8_t* src;
    uint8_t* dst;
    std::vector<uint8_t> bytes;
  };
  struct Batch {
    std::vector<Leaf> leaves;
    std::deque<Tensor> tensors;
    std::vector<DLTensor> sources, destinations;
    qlink_copy_args args() const {
      return {QLINK_COPY_ARGS_STRUCT_SIZE, sources.data(), destinations.data(), sources.size(), nullptr, 0};
    }
  };
  bool Fill(Batch* b) {
    const int leaves = 1 + static_cast<int>(rng_() % kMaxLeaves);
    for (int i = 0; i < leaves; ++i) {
      Leaf leaf{Device(), Device(), nullptr, nullptr, std::vector<uint8_t>(1 + rng_() % kMaxLeaf)};
      leaf.src = arenas_[leaf.src_device] + i * kMaxLeaf;
      leaf.dst = arenas_[leaf.dst_device] + (kMaxLeaves + i) * kMaxLeaf;
      Scribble(&leaf.bytes);
      const std::vector<uint8_t> zeros(leaf.bytes.size(), 0);
      if (!Check(api_.memory_from_host(ctx_, leaf.src_device, leaf.src, leaf.bytes.data(), leaf.bytes.size()), QLINK_OK,
                 "memory_from_host") ||
          !Check(api_.memory_from_host(ctx_, leaf.dst_device, leaf.dst, zeros.data(), zeros.size()), QLINK_OK,
                 "memory_from_host")) {
        return false;
      }
      const int64_t n = static_cast<int64_t>(leaf.bytes.size());
      b->sources.push_back(b->tensors.emplace_back(leaf.src, n, type_, leaf.src_device).dl);
      b->destinations.push_back(b->tensors.emplace_back(leaf.dst, n, type_, leaf.dst_device).dl);
      b->leaves.push_back(std::move(leaf));
    }
    return true;
  }

  // What the destinations hold once the work enqueued on them is done: `expected` each
  // leaf's bytes, or zeros.
  bool Holds(const Batch& b, bool expected, const char* what) {
    for (const Leaf& leaf : b.leaves) {
      if (!Check(api_.stream_synchronize(ctx_, leaf.dst_device, nullptr), QLINK_OK, "stream_synchronize")) return false;
      std::vector<uint8_t> got(leaf.bytes.size(), 0xee);
      if (!Check(api_.memory_to_host(ctx_, leaf.dst_device, got.data(), leaf.dst, got.size()), QLINK_OK,
                 "memory_to_host")) {
        return false;
      }
      const bool ok =
          expected ? got == leaf.bytes : std::all_of(got.begin(), got.end(), [](uint8_t x) { return x == 0; });
      if (!ok) {
        failures_.Add("thread " + std::to_string(id_) + ": " + what +
                      (expected ? " did not copy byte-exact" : " wrote a destination"));
        return false;
      }
    }
    return true;
  }

  bool Do(Op op) {
    switch (op) {
      case kCopyBatch: {
        Batch b;
        if (!Fill(&b)) return false;
        const qlink_copy_args args = b.args();
        return Check(api_.copy_batch(ctx_, &args), QLINK_OK, "copy_batch") && Holds(b, true, "copy_batch");
      }
      case kCopyPlan: {
        Batch b;
        if (!Fill(&b)) return false;
        const qlink_copy_args args = b.args();
        qlink_copy_plan* plan = nullptr;
        if (!Check(api_.copy_plan_create(ctx_, &args, &plan), QLINK_OK, "copy_plan_create")) return false;
        bool ok = Check(api_.copy_plan_execute(plan, nullptr, 0), QLINK_OK, "copy_plan_execute") &&
                  Holds(b, true, "copy_plan_execute");
        return Check(api_.copy_plan_destroy(plan), QLINK_OK, "copy_plan_destroy") && ok;
      }
      case kQueries: {
        const int src = Device(), dst = Device();
        qlink_peer_info peer{};
        peer.struct_size = QLINK_PEER_INFO_STRUCT_SIZE;
        qlink_device_info info{};
        info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
        if (!Check(api_.peer_info(ctx_, src, dst, &peer), QLINK_OK, "peer_info")) return false;
        const bool known_state = peer.state >= QLINK_PEER_NOT_APPLICABLE && peer.state <= QLINK_PEER_ENABLED;
        return Check(known_state && (src != dst || peer.state == QLINK_PEER_NOT_APPLICABLE) ? QLINK_OK : QLINK_INTERNAL,
                     QLINK_OK, "peer state") &&
               Check(api_.device_info(ctx_, src, &info), QLINK_OK, "device_info") &&
               Check(info.device.device_id == src ? QLINK_OK : QLINK_INTERNAL, QLINK_OK, "device_info id");
      }
      case kEnablePeers: {
        std::vector<int32_t> devices;
        for (int d = 0; d < devices_; ++d) {
          if (rng_() % 2) devices.push_back(d);
        }
        return Check(api_.enable_peer_access(ctx_, devices.data(), devices.size()), QLINK_OK, "enable_peer_access");
      }
      case kRefusedBatch: {
        Batch b;
        if (!Fill(&b)) return false;
        const size_t bad = rng_() % b.sources.size();
        if (rng_() % 2) {
          b.destinations[bad].device.device_id = devices_ + 1;
        } else {
          b.sources[bad].data = nullptr;
        }
        const qlink_copy_args args = b.args();
        return Check(api_.copy_batch(ctx_, &args), QLINK_INVALID_ARGUMENT, "refused copy_batch") &&
               Holds(b, false, "a refused batch");
      }
      case kMemory: {
        const int device = Device();
        std::vector<uint8_t> in(1 + rng_() % 8192), out(in.size(), 0);
        Scribble(&in);
        void* p = nullptr;
        if (!Check(api_.memory_allocate(ctx_, device, in.size(), &p), QLINK_OK, "memory_allocate")) return false;
        bool ok = Check(api_.memory_from_host(ctx_, device, p, in.data(), in.size()), QLINK_OK, "memory_from_host") &&
                  Check(api_.memory_to_host(ctx_, device, out.data(), p, out.size()), QLINK_OK, "memory_to_host") &&
                  Check(in == out ? QLINK_OK : QLINK_INTERNAL, QLINK_OK, "memory round trip");
        return Check(api_.memory_free(ctx_, device, p), QLINK_OK, "memory_free") && ok;
      }
      case kNewContext: {
        qlink_context* own = nullptr;
        if (!Check(api_.context_create(ConfigJson().c_str(), &own), QLINK_OK, "context_create")) return false;
        int32_t count = 0;
        bool ok = Check(api_.device_count(own, &count), QLINK_OK, "device_count") &&
                  Check(count == devices_ ? QLINK_OK : QLINK_INTERNAL, QLINK_OK, "device_count of a new context");
        return Check(api_.context_destroy(own), QLINK_OK, "context_destroy") && ok;
      }
      default:
        return false;
    }
  }

  const qlink_api& api_;
  qlink_context* ctx_;
  const int id_;
  std::mt19937 rng_;
  Failures& failures_;
  int32_t devices_ = 0;
  DLDeviceType type_ = kDLCPU;
  std::vector<uint8_t*> arenas_;  // per device: this thread's leaves live here
};

TEST(Stress, ThreadsMixingEveryCallOnOneContext) {
  Plugin plugin;
  Context ctx(plugin, ConfigJson());
  ASSERT_EQ(ctx.status(), QLINK_OK) << plugin.api().last_error();
  Failures failures;
  std::array<std::atomic<int>, kNumOps> done{};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { Worker(plugin.api(), ctx.get(), t, failures).Run(done); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.count(), 0) << failures.first();
  int total = 0;
  for (int op = 0; op < kNumOps; ++op) {
    total += done[op].load();
    EXPECT_GT(done[op].load(), 0) << kOpNames[op];
    std::printf("%-24s %7d\n", kOpNames[op], done[op].load());
  }
  EXPECT_EQ(total, kThreads * kOpsPerThread);
  ::testing::Test::RecordProperty("operations", total);
}

}  // namespace
}  // namespace qlink_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--config=", 0) == 0) qlink_test::ConfigJson() = arg.substr(9);
  }
  return RUN_ALL_TESTS();
}
