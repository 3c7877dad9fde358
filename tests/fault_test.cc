// Faults injected through the test backend (backends/fault): each failing call returns a
// clear status and message, a refused batch writes nothing, the context keeps working
// afterwards, and (under ASan) nothing leaks. The backend's streams are asynchronous, so
// the ordering tests fail with wrong bytes if core forgets a stream join.
#include <chrono>
#include <cstring>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/host/plugin.h"

namespace qlink_test {
namespace {

using ::testing::HasSubstr;

std::string FaultConfig(const std::string& options, const std::string& p2p = R"({"mode": "auto"})") {
  return R"({"backend": ")" + RunfilePath("libqlink_backend_fault.so") + R"(", "log_level": "off", "p2p": )" + p2p +
         R"(, "backend_options": )" + options + "}";
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31);
  return v;
}

// Host buffers and the DLTensors over them for one batch.
class Batch {
 public:
  void Add(const std::vector<uint8_t>& content, int src_device, int dst_device) {
    src_.push_back(content);
    dst_.emplace_back(content.size(), 0);
    sources_.push_back(tensors_.emplace_back(src_.back().data(), content.size(), kDLCPU, src_device).dl);
    destinations_.push_back(tensors_.emplace_back(dst_.back().data(), content.size(), kDLCPU, dst_device).dl);
  }
  qlink_copy_args args() const {
    return {QLINK_COPY_ARGS_STRUCT_SIZE, sources_.data(), destinations_.data(), sources_.size(), nullptr, 0};
  }
  std::deque<std::vector<uint8_t>>& src() { return src_; }
  std::deque<std::vector<uint8_t>>& dst() { return dst_; }
  std::vector<DLTensor>& destinations() { return destinations_; }

 private:
  std::deque<std::vector<uint8_t>> src_, dst_;  // deques: Add keeps earlier buffers in place
  std::deque<Tensor> tensors_;
  std::vector<DLTensor> sources_, destinations_;
};

class Faults : public ::testing::Test {
 protected:
  std::string LastError() const { return api_.last_error(); }

  void SynchronizeAll(const Context& ctx, int devices) {
    for (int d = 0; d < devices; ++d) ASSERT_EQ(api_.stream_synchronize(ctx.get(), d, nullptr), QLINK_OK) << d;
  }

  // A batch of `leaves` leaves from device `from` to `to` that must arrive byte-exact.
  void ExpectCopyWorks(const Context& ctx, int from, int to, int devices, size_t leaves = 3) {
    Batch batch;
    for (size_t i = 0; i < leaves; ++i) batch.Add(Pattern(1000 + i * 70000, static_cast<uint8_t>(i)), from, to);
    const qlink_copy_args args = batch.args();
    ASSERT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_OK) << LastError();
    SynchronizeAll(ctx, devices);
    for (size_t i = 0; i < leaves; ++i) EXPECT_EQ(batch.src()[i], batch.dst()[i]) << "leaf " << i;
  }

  qlink_peer_info Peer(const Context& ctx, int src, int dst) {
    qlink_peer_info info{};
    info.struct_size = QLINK_PEER_INFO_STRUCT_SIZE;
    EXPECT_EQ(api_.peer_info(ctx.get(), src, dst, &info), QLINK_OK) << LastError();
    return info;
  }

  Plugin plugin_;
  const qlink_api& api_ = plugin_.api();
};

TEST_F(Faults, UnknownBackendOptionIsRefusedByTheBackend) {
  qlink_context* ctx = nullptr;
  EXPECT_EQ(api_.context_create(FaultConfig(R"({"devices": 2, "flaky": true})").c_str(), &ctx), QLINK_UNAVAILABLE);
  EXPECT_THAT(LastError(), HasSubstr("backend_options.flaky is unknown"));
  EXPECT_EQ(api_.context_create(FaultConfig(R"({"unsupported_pairs": [[0, 5]]})").c_str(), &ctx), QLINK_UNAVAILABLE);
  EXPECT_THAT(LastError(), HasSubstr("unsupported_pairs names device pair 0->5"));
  EXPECT_EQ(ctx, nullptr);
}

TEST_F(Faults, AsymmetricUnsupportedPairIsReportedAndStillCopies) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 3, "unsupported_pairs": [[0, 1]]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const int32_t all[] = {0, 1, 2};
  ASSERT_EQ(api_.enable_peer_access(ctx.get(), all, 3), QLINK_OK) << LastError();
  const qlink_peer_info refused = Peer(ctx, 0, 1);
  EXPECT_EQ(refused.state, QLINK_PEER_UNSUPPORTED);
  EXPECT_THAT(refused.reason, HasSubstr("no peer access from device 1 to device 0"));
  EXPECT_EQ(Peer(ctx, 1, 0).state, QLINK_PEER_ENABLED);  // the other direction is fine
  EXPECT_EQ(Peer(ctx, 0, 2).state, QLINK_PEER_ENABLED);
  ExpectCopyWorks(ctx, 0, 1, 3);  // staged instead of pulled
  ExpectCopyWorks(ctx, 1, 0, 3);
}

TEST_F(Faults, RefusedPairFailsModeOnNamingThePair) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "unsupported_pairs": [[1, 0]]})", R"({"mode": "on"})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const int32_t both[] = {0, 1};
  EXPECT_EQ(api_.enable_peer_access(ctx.get(), both, 2), QLINK_UNAVAILABLE);
  EXPECT_THAT(LastError(), HasSubstr("pair(s) 1->0 cannot use peer access"));
  ExpectCopyWorks(ctx, 1, 0, 2);
}

TEST_F(Faults, PeerEnableFailureIsReported) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 3, "enable_failing_pairs": [[2, 0]]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const int32_t all[] = {0, 1, 2};
  ASSERT_EQ(api_.enable_peer_access(ctx.get(), all, 3), QLINK_OK) << LastError();
  const qlink_peer_info failed = Peer(ctx, 2, 0);
  EXPECT_EQ(failed.state, QLINK_PEER_ENABLE_FAILED);
  EXPECT_THAT(failed.reason, HasSubstr("enabling peer access 2->0 failed (injected)"));
  EXPECT_EQ(Peer(ctx, 0, 2).state, QLINK_PEER_ENABLED);
  ExpectCopyWorks(ctx, 2, 0, 3);
}

TEST_F(Faults, LeafFailingInTheMiddleOfABatch) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "fail_leaf": 2})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  Batch batch;
  for (int i = 0; i < 5; ++i) batch.Add(Pattern(256, static_cast<uint8_t>(i)), 0, 1);
  const qlink_copy_args args = batch.args();
  EXPECT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_RUNTIME_ERROR);
  EXPECT_THAT(LastError(), HasSubstr("copy of leaf 2 of 5 to device 1 failed (injected)"));
  SynchronizeAll(ctx, 2);
  EXPECT_EQ(batch.src()[0], batch.dst()[0]);  // enqueued before the failure
  EXPECT_EQ(batch.dst()[4], std::vector<uint8_t>(256, 0));
  ASSERT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_OK) << LastError();  // the same batch, retried
  SynchronizeAll(ctx, 2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(batch.src()[i], batch.dst()[i]) << "leaf " << i;
}

TEST_F(Faults, FailingAllocation) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "fail_allocation": 0})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  void* p = nullptr;
  EXPECT_EQ(api_.memory_allocate(ctx.get(), 1, 4096, &p), QLINK_OUT_OF_MEMORY);
  EXPECT_THAT(LastError(), HasSubstr("allocation 0 (4096 bytes on device 1) failed (injected)"));
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(api_.memory_allocate(ctx.get(), 1, 4096, &p), QLINK_OK) << LastError();
  EXPECT_EQ(api_.memory_free(ctx.get(), 1, p), QLINK_OK);
}

// measure_link allocates a source, then a destination: the second failing must free the first.
TEST_F(Faults, FailingAllocationInsideAProbeReleasesTheFirst) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "fail_allocation": 1})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  qlink_link_measurement m{};
  m.struct_size = QLINK_LINK_MEASUREMENT_STRUCT_SIZE;
  EXPECT_EQ(api_.measure_link(ctx.get(), 0, 1, 1 << 16, &m), QLINK_OUT_OF_MEMORY);
  EXPECT_THAT(LastError(), HasSubstr("allocation 1"));
  ASSERT_EQ(api_.measure_link(ctx.get(), 0, 1, 1 << 16, &m), QLINK_OK) << LastError();
  EXPECT_GT(m.gbps, 0.0);
}

TEST_F(Faults, LostDeviceFailsEveryCallOnItAndNoOther) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 3, "lose_device": {"device": 1, "after_copies": 1}})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  ExpectCopyWorks(ctx, 0, 1, 3, 1);  // the one copy before the loss
  Batch batch;
  batch.Add(Pattern(512, 9), 0, 1);
  const qlink_copy_args args = batch.args();
  EXPECT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_RUNTIME_ERROR);
  EXPECT_THAT(LastError(), HasSubstr("device 1 lost"));
  EXPECT_EQ(api_.stream_synchronize(ctx.get(), 1, nullptr), QLINK_RUNTIME_ERROR);
  EXPECT_THAT(LastError(), HasSubstr("device 1 lost"));
  qlink_device_info info{};
  info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
  EXPECT_EQ(api_.device_info(ctx.get(), 1, &info), QLINK_RUNTIME_ERROR);
  void* p = nullptr;
  EXPECT_EQ(api_.memory_allocate(ctx.get(), 1, 64, &p), QLINK_RUNTIME_ERROR);
  const int32_t pair[] = {1, 2};
  EXPECT_EQ(api_.enable_peer_access(ctx.get(), pair, 2), QLINK_OK);  // auto mode: reported per pair
  EXPECT_THAT(Peer(ctx, 1, 2).reason, HasSubstr("device 1 lost"));
  ExpectCopyWorks(ctx, 0, 2, 1);  // device 1 only is gone
  ExpectCopyWorks(ctx, 2, 0, 1);
}

TEST_F(Faults, RefusedBatchOnBusyStreamsWritesNothing) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "stream_delay_ms": [20, 20]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  Batch batch;
  for (int i = 0; i < 4; ++i) batch.Add(Pattern(128, static_cast<uint8_t>(i)), i % 2, (i + 1) % 2);
  batch.destinations()[3].data = batch.dst()[1].data() + 64;  // overlaps destinations[1]
  const qlink_copy_args args = batch.args();
  EXPECT_EQ(api_.copy_batch(ctx.get(), &args), QLINK_INVALID_ARGUMENT);
  EXPECT_THAT(LastError(), HasSubstr("destinations[1] overlaps destinations[3]"));
  SynchronizeAll(ctx, 2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(batch.dst()[i], std::vector<uint8_t>(128, 0)) << "destination " << i;
  ExpectCopyWorks(ctx, 0, 1, 2);
}

// A slow producer on device 0's stream (a same-device copy into `staged`), then a copy of
// `staged` to device 1: device 1's stream must wait for the producer (forward join).
TEST_F(Faults, ReaderOnTheDestinationStreamSeesASlowProducerComplete) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "stream_delay_ms": [100, 0]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const size_t n = 1 << 18;  // above the pull crossover: a runtime copy; the small one below is pulled
  for (size_t bytes : {n, size_t{4096}}) {
    std::vector<uint8_t> produced = Pattern(bytes, 3), staged(bytes, 0), result(bytes, 0);
    Tensor p(produced.data(), bytes, kDLCPU, 0), s0(staged.data(), bytes, kDLCPU, 0);
    Tensor s1(staged.data(), bytes, kDLCPU, 0), r(result.data(), bytes, kDLCPU, 1);
    const qlink_copy_args produce{QLINK_COPY_ARGS_STRUCT_SIZE, &p.dl, &s0.dl, 1, nullptr, 0};
    const qlink_copy_args read{QLINK_COPY_ARGS_STRUCT_SIZE, &s1.dl, &r.dl, 1, nullptr, 0};
    ASSERT_EQ(api_.copy_batch(ctx.get(), &produce), QLINK_OK) << LastError();
    ASSERT_EQ(api_.copy_batch(ctx.get(), &read), QLINK_OK) << LastError();
    ASSERT_EQ(api_.stream_synchronize(ctx.get(), 1, nullptr), QLINK_OK);
    EXPECT_EQ(result, produced) << bytes << " bytes: device 1 read before device 0's producer finished";
    SynchronizeAll(ctx, 2);
  }
}

// A slow reader on device 1, then device 0 overwrites the source on its own stream: the
// overwrite must wait until device 1 has read it (backward join).
TEST_F(Faults, SourceOverwrittenInStreamOrderAfterASlowReader) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 2, "stream_delay_ms": [0, 100]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const size_t n = 1 << 18;
  std::vector<uint8_t> source = Pattern(n, 5), result(n, 0), next = Pattern(n, 77);
  Tensor s(source.data(), n, kDLCPU, 0), r(result.data(), n, kDLCPU, 1);
  Tensor from(next.data(), n, kDLCPU, 0), over(source.data(), n, kDLCPU, 0);
  const std::vector<uint8_t> expected = source;
  const qlink_copy_args read{QLINK_COPY_ARGS_STRUCT_SIZE, &s.dl, &r.dl, 1, nullptr, 0};
  const qlink_copy_args overwrite{QLINK_COPY_ARGS_STRUCT_SIZE, &from.dl, &over.dl, 1, nullptr, 0};
  ASSERT_EQ(api_.copy_batch(ctx.get(), &read), QLINK_OK) << LastError();
  ASSERT_EQ(api_.copy_batch(ctx.get(), &overwrite), QLINK_OK) << LastError();
  SynchronizeAll(ctx, 2);
  EXPECT_EQ(result, expected) << "device 0 overwrote the source before device 1 read it";
  EXPECT_EQ(source, next);
}

// The promises of qlink_copy_args.flags hand a join to the host. Device `slow`'s stream
// takes 200 ms per operation; a copy between other buffers then either waits for it (the
// join) or not (the promise), which shows in how long synchronizing the other side takes.
// The buffers are disjoint, so skipping a join races with nothing.
TEST_F(Faults, CopyFlagsHandEachJoinToTheHost) {
  using Clock = std::chrono::steady_clock;
  const size_t n = 4096;
  struct Case {
    int slow;          // the device whose stream is slow
    uint32_t flag;     // the promise that skips the join through that stream
    int synchronized;  // the device timed after the copy
  };
  for (const Case c : {Case{0, QLINK_COPY_SOURCES_READY, 1}, Case{1, QLINK_COPY_SOURCES_HELD, 0}}) {
    for (uint32_t flags : {0u, c.flag}) {
      const std::string delays = c.slow == 0 ? "[200, 0]" : "[0, 200]";
      Context ctx(plugin_, FaultConfig(R"({"devices": 2, "stream_delay_ms": )" + delays + "}"));
      ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
      std::vector<uint8_t> a = Pattern(n, 1), b(n, 0), src = Pattern(n, 2), dst(n, 0);
      Tensor busy_from(a.data(), n, kDLCPU, c.slow), busy_to(b.data(), n, kDLCPU, c.slow);
      Tensor s(src.data(), n, kDLCPU, 0), d(dst.data(), n, kDLCPU, 1);
      // Slow work on `slow`'s stream (a copy within it), then the copy 0 -> 1.
      const qlink_copy_args busy{QLINK_COPY_ARGS_STRUCT_SIZE, &busy_from.dl, &busy_to.dl, 1, nullptr, 0};
      const qlink_copy_args copy{sizeof(qlink_copy_args), &s.dl, &d.dl, 1, nullptr, 0, flags};
      if (c.slow == 0) {
        ASSERT_EQ(api_.copy_batch(ctx.get(), &busy), QLINK_OK) << LastError();
      }
      ASSERT_EQ(api_.copy_batch(ctx.get(), &copy), QLINK_OK) << LastError();
      if (c.slow == 1) {
        ASSERT_EQ(api_.copy_batch(ctx.get(), &busy), QLINK_OK) << LastError();
      }
      const auto start = Clock::now();
      ASSERT_EQ(api_.stream_synchronize(ctx.get(), c.synchronized, nullptr), QLINK_OK);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (flags == 0) {
        EXPECT_GE(waited, 150) << "device " << c.synchronized << " did not wait for device " << c.slow;
      } else {
        EXPECT_LT(waited, 150) << "device " << c.synchronized << " waited for device " << c.slow << " although flags "
                               << flags << " said not to";
      }
      SynchronizeAll(ctx, 2);
      EXPECT_EQ(dst, src);
    }
  }
}

// QLINK_COPY_WAIT: a copy, a prepared copy and a broadcast return with their destinations
// written however slow the destination streams are; without the flag they return at once.
TEST_F(Faults, WaitReturnsOnceTheDestinationsHoldTheData) {
  using Clock = std::chrono::steady_clock;
  Context ctx(plugin_, FaultConfig(R"({"devices": 3, "stream_delay_ms": [0, 100, 100]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const size_t n = 4096;
  std::vector<uint8_t> src = Pattern(n, 9);
  Tensor s(src.data(), n, kDLCPU, 0);
  for (const char* call : {"copy_batch", "copy_plan_execute", "broadcast"}) {
    for (uint32_t flags : {0u, uint32_t{QLINK_COPY_WAIT}}) {
      std::vector<uint8_t> one(n, 0), two(n, 0);
      Tensor d1(one.data(), n, kDLCPU, 1), d2(two.data(), n, kDLCPU, 2);
      const DLTensor replicas[] = {d1.dl, d2.dl};
      const qlink_copy_args copy{sizeof(qlink_copy_args), &s.dl, &d1.dl, 1, nullptr, 0, flags};
      qlink_copy_plan* plan = nullptr;
      if (std::string(call) == "copy_plan_execute") {
        ASSERT_EQ(api_.copy_plan_create(ctx.get(), &copy, &plan), QLINK_OK) << LastError();
      }
      const auto start = Clock::now();
      if (std::string(call) == "copy_batch") {
        ASSERT_EQ(api_.copy_batch(ctx.get(), &copy), QLINK_OK) << LastError();
      } else if (plan != nullptr) {
        ASSERT_EQ(api_.copy_plan_execute(plan, nullptr, 0), QLINK_OK) << LastError();
      } else {
        const qlink_broadcast_args bcast{sizeof(qlink_broadcast_args), &s.dl, 1, replicas, 2, nullptr, 0, flags};
        ASSERT_EQ(api_.broadcast(ctx.get(), &bcast), QLINK_OK) << LastError();
      }
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (flags == QLINK_COPY_WAIT) {
        EXPECT_GE(took, 90) << call << " returned before the destination stream ran the copy";
        EXPECT_EQ(one, src) << call;  // read before any synchronize: the call itself waited
        if (std::string(call) == "broadcast") {
          EXPECT_EQ(two, src) << call;
        }
      } else {
        EXPECT_LT(took, 90) << call << " blocked without QLINK_COPY_WAIT";
      }
      SynchronizeAll(ctx, 3);
      EXPECT_EQ(one, src) << call;
      if (plan != nullptr) api_.copy_plan_destroy(plan);
    }
  }
}

// Collectives on slow asynchronous streams: each device's part must wait for that device's
// producer, and the relayed broadcast for the replica it reads from.
TEST_F(Faults, CollectivesWaitForSlowProducersOnEveryDevice) {
  Context ctx(plugin_, FaultConfig(R"({"devices": 3, "stream_delay_ms": [60, 0, 30]})"));
  ASSERT_EQ(ctx.status(), QLINK_OK) << LastError();
  const int32_t all[] = {0, 1, 2};
  ASSERT_EQ(api_.enable_peer_access(ctx.get(), all, 3), QLINK_OK) << LastError();
  constexpr size_t kCount = 5000;
  constexpr DLDataType kF32{kDLFloat, 32, 1};
  for (int32_t transport : {QLINK_TRANSPORT_FP32, QLINK_TRANSPORT_BF16}) {
    // Each device's buffer is produced on its own stream by a same-device copy from `fresh`.
    std::vector<std::vector<float>> fresh(3, std::vector<float>(kCount)), buf(3, std::vector<float>(kCount, 0.0f));
    std::deque<Tensor> t;
    std::vector<DLTensor> bufs;
    for (int d = 0; d < 3; ++d) {
      for (size_t i = 0; i < kCount; ++i) fresh[d][i] = static_cast<float>((d + 1) * (i % 7));  // exact in bf16
      const DLTensor& from = t.emplace_back(fresh[d].data(), kCount * 4, kDLCPU, d, kF32).dl;
      const DLTensor& to = t.emplace_back(buf[d].data(), kCount * 4, kDLCPU, d, kF32).dl;
      const qlink_copy_args produce{QLINK_COPY_ARGS_STRUCT_SIZE, &from, &to, 1, nullptr, 0};
      ASSERT_EQ(api_.copy_batch(ctx.get(), &produce), QLINK_OK) << LastError();
      bufs.push_back(to);
    }
    qlink_all_reduce_args args{
        QLINK_ALL_REDUCE_ARGS_STRUCT_SIZE, bufs.data(), 3, QLINK_REDUCE_SUM, transport, nullptr, 0};
    ASSERT_EQ(api_.all_reduce(ctx.get(), &args), QLINK_OK) << LastError();
    SynchronizeAll(ctx, 3);
    for (int d = 0; d < 3; ++d) {
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(buf[d][i], 6.0f * (i % 7)) << "device " << d << " element " << i;
    }
  }
  // Reduce into device 1 while device 0's partial is still being produced.
  std::vector<float> fresh(kCount, 2.0f), partial0(kCount, 0.0f), partial2(kCount, 1.0f), out(kCount, 0.0f);
  Tensor from(fresh.data(), kCount * 4, kDLCPU, 0, kF32), p0(partial0.data(), kCount * 4, kDLCPU, 0, kF32);
  Tensor p2(partial2.data(), kCount * 4, kDLCPU, 2, kF32), o(out.data(), kCount * 4, kDLCPU, 1, kF32);
  const qlink_copy_args produce{QLINK_COPY_ARGS_STRUCT_SIZE, &from.dl, &p0.dl, 1, nullptr, 0};
  ASSERT_EQ(api_.copy_batch(ctx.get(), &produce), QLINK_OK) << LastError();
  const DLTensor inputs[] = {p2.dl, p0.dl};
  qlink_reduce_args reduce{QLINK_REDUCE_ARGS_STRUCT_SIZE, inputs, 2, &o.dl, 0.5, nullptr, 0};
  ASSERT_EQ(api_.reduce(ctx.get(), &reduce), QLINK_OK) << LastError();
  SynchronizeAll(ctx, 3);
  EXPECT_EQ(out, std::vector<float>(kCount, 1.5f));
  // Broadcast 0 -> {1, 2}: the second round relays from a replica on a slow stream.
  std::vector<uint8_t> src = Pattern(1 << 16, 9), r1(1 << 16, 0), r2(1 << 16, 0);
  Tensor s(src.data(), src.size(), kDLCPU, 0), d1(r1.data(), r1.size(), kDLCPU, 1), d2(r2.data(), r2.size(), kDLCPU, 2);
  const DLTensor replicas[] = {d2.dl, d1.dl};
  qlink_broadcast_args bcast{QLINK_BROADCAST_ARGS_STRUCT_SIZE, &s.dl, 1, replicas, 2, nullptr, 0};
  ASSERT_EQ(api_.broadcast(ctx.get(), &bcast), QLINK_OK) << LastError();
  SynchronizeAll(ctx, 3);
  EXPECT_EQ(r1, src);
  EXPECT_EQ(r2, src);
}

}  // namespace
}  // namespace qlink_test
