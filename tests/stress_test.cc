// Many host threads on one CPU-backend context through the dlopen'ed ABI: mixed copies
// (checked byte for byte), prepared plans, topology queries, peer enabling, refused
// batches, and contexts created and destroyed alongside. Run under the sanitizers too.
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
constexpr int kDevices = 4;
constexpr char kConfig[] = R"({"backend": "cpu", "cpu_devices": 4, "log_level": "off"})";

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
      : api_(api), ctx_(ctx), id_(id), rng_(1234 + id), failures_(failures) {}

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

  int Device() { return static_cast<int>(rng_() % kDevices); }

  // Bytes that differ per buffer and per position, cheaply: a byte drawn per byte would
  // cost more than the calls under test.
  void Scribble(std::vector<uint8_t>* bytes) {
    const uint32_t seed = rng_();
    for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = static_cast<uint8_t>(seed + i * 167 + (i >> 8));
  }

  // A random batch of 1-4 leaves of 1-4096 bytes over host buffers this thread owns.
  struct Batch {
    std::deque<std::vector<uint8_t>> src, dst;
    std::deque<Tensor> tensors;
    std::vector<DLTensor> sources, destinations;
    qlink_copy_args args() const {
      return {QLINK_COPY_ARGS_STRUCT_SIZE, sources.data(), destinations.data(), sources.size(), nullptr, 0};
    }
    bool Arrived() const { return src == dst; }
  };
  void Fill(Batch* b) {
    const int leaves = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < leaves; ++i) {
      const size_t n = 1 + rng_() % 4096;
      b->src.emplace_back(n);
      Scribble(&b->src.back());
      b->dst.emplace_back(n, 0);
      b->sources.push_back(b->tensors.emplace_back(b->src.back().data(), n, kDLCPU, Device()).dl);
      b->destinations.push_back(b->tensors.emplace_back(b->dst.back().data(), n, kDLCPU, Device()).dl);
    }
  }

  bool Arrived(const Batch& b, const char* what) {
    if (b.Arrived()) return true;
    failures_.Add("thread " + std::to_string(id_) + ": " + what + " did not copy byte-exact");
    return false;
  }

  bool Do(Op op) {
    switch (op) {
      case kCopyBatch: {
        Batch b;
        Fill(&b);
        const qlink_copy_args args = b.args();
        return Check(api_.copy_batch(ctx_, &args), QLINK_OK, "copy_batch") && Arrived(b, "copy_batch");
      }
      case kCopyPlan: {
        Batch b;
        Fill(&b);
        const qlink_copy_args args = b.args();
        qlink_copy_plan* plan = nullptr;
        if (!Check(api_.copy_plan_create(ctx_, &args, &plan), QLINK_OK, "copy_plan_create")) return false;
        bool ok = Check(api_.copy_plan_execute(plan, nullptr, 0), QLINK_OK, "copy_plan_execute") &&
                  Arrived(b, "copy_plan_execute");
        return Check(api_.copy_plan_destroy(plan), QLINK_OK, "copy_plan_destroy") && ok;
      }
      case kQueries: {
        const int src = Device(), dst = Device();
        qlink_peer_info peer{};
        peer.struct_size = QLINK_PEER_INFO_STRUCT_SIZE;
        qlink_device_info info{};
        info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
        return Check(api_.peer_info(ctx_, src, dst, &peer), QLINK_OK, "peer_info") &&
               Check(peer.state == QLINK_PEER_NOT_APPLICABLE ? QLINK_OK : QLINK_INTERNAL, QLINK_OK, "peer state") &&
               Check(api_.device_info(ctx_, src, &info), QLINK_OK, "device_info") &&
               Check(info.device.device_id == src ? QLINK_OK : QLINK_INTERNAL, QLINK_OK, "device_info id");
      }
      case kEnablePeers: {
        std::vector<int32_t> devices;
        for (int d = 0; d < kDevices; ++d) {
          if (rng_() % 2) devices.push_back(d);
        }
        return Check(api_.enable_peer_access(ctx_, devices.data(), devices.size()), QLINK_OK, "enable_peer_access");
      }
      case kRefusedBatch: {
        Batch b;
        Fill(&b);
        const size_t bad = rng_() % b.sources.size();
        if (rng_() % 2) {
          b.destinations[bad].device.device_id = kDevices + 1;
        } else {
          b.sources[bad].data = nullptr;
        }
        const qlink_copy_args args = b.args();
        bool refused = Check(api_.copy_batch(ctx_, &args), QLINK_INVALID_ARGUMENT, "refused copy_batch");
        for (auto& d : b.dst) {
          if (std::any_of(d.begin(), d.end(), [](uint8_t x) { return x != 0; })) {
            failures_.Add("thread " + std::to_string(id_) + ": a refused batch wrote a destination");
            return false;
          }
        }
        return refused;
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
        if (!Check(api_.context_create(kConfig, &own), QLINK_OK, "context_create")) return false;
        std::swap(own, ctx_);
        bool ok = Do(kCopyBatch);
        std::swap(own, ctx_);
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
};

TEST(Stress, ThreadsMixingEveryCallOnOneContext) {
  Plugin plugin;
  Context ctx(plugin, kConfig);
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
