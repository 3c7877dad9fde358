// Host cost of qlink's hot entry points, called from C++ through the ABI (no Python):
// enqueue time per call (mean of back-to-back calls) and time to completion on the
// destination (best of 30, each followed by stream_synchronize; a QLINK_COPY_WAIT call
// alone). Python's share of a figure in copy_bench.py is the difference.
// Usage: abi_overhead PATH/libqlink.so
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <boost/dll/shared_library.hpp>

#include "plugin_api/qlink.h"

namespace {

double NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Harness {
  const qlink_api* api;
  qlink_context* ctx;

  void Check(qlink_status s, const char* what) const {
    if (s != QLINK_OK) {
      std::fprintf(stderr, "%s: %s\n", what, api->last_error());
      std::exit(1);
    }
  }
  void Sync() const {
    for (int d = 0; d < 2; ++d) Check(api->stream_synchronize(ctx, d, nullptr), "stream_synchronize");
  }
  // Mean enqueue time of back-to-back calls, synchronized every 50 calls (untimed).
  double EnqueueUs(const std::function<void()>& call) const {
    call();
    Sync();
    double total = 0;
    for (int round = 0; round < 20; ++round) {
      const double t0 = NowUs();
      for (int i = 0; i < 50; ++i) call();
      total += NowUs() - t0;
      Sync();
    }
    return total / 1000;
  }
  // Best of 30: the call, then synchronizing `device` (none: -1, for a call that waits).
  double CompletionUs(const std::function<void()>& call, int device) const {
    call();
    Sync();
    double best = 1e30;
    for (int r = 0; r < 30; ++r) {
      const double t0 = NowUs();
      call();
      if (device >= 0) Check(api->stream_synchronize(ctx, device, nullptr), "stream_synchronize");
      best = std::min(best, NowUs() - t0);
      Sync();
    }
    return best;
  }
};

DLTensor Bytes(void* data, int64_t* shape, int device, DLDataType dtype = {kDLUInt, 8, 1}) {
  return DLTensor{data, {kDLCUDA, device}, 1, dtype, shape, nullptr, 0};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PATH/libqlink.so\n", argv[0]);
    return 2;
  }
  boost::dll::shared_library lib(argv[1], boost::dll::load_mode::rtld_local);
  const char* error = nullptr;
  Harness h{lib.get<const qlink_api*(uint32_t, uint32_t, const char**)>("qlink_get_api")(QLINK_ABI_MAJOR,
                                                                                         QLINK_ABI_MINOR, &error),
            nullptr};
  if (h.api == nullptr) {
    std::fprintf(stderr, "%s\n", error);
    return 1;
  }
  h.Check(h.api->context_create(R"({"backend": "cuda", "log_level": "warn"})", &h.ctx), "context_create");
  int32_t count = 0;
  h.Check(h.api->device_count(h.ctx, &count), "device_count");
  if (count < 2) {
    std::printf("needs two GPUs, found %d\n", count);
    return 0;
  }
  const int32_t devices[] = {0, 1};
  h.Check(h.api->enable_peer_access(h.ctx, devices, 2), "enable_peer_access");

  std::printf("%-44s %12s %14s\n", "call", "enqueue_us", "completion_us");
  // The module-move shapes of docs/BASELINES.md, as p2p_bench.cu times its raw paths (best of 30,
  // synchronizing the destination's stream).
  const std::vector<std::pair<int, int64_t>> shapes = {{8, 32768},    {64, 32768},    {8, 262144},
                                                       {64, 262144},  {256, 65536},   {8, 2 << 20},
                                                       {64, 2 << 20}, {16, 16 << 20}, {4, 64 << 20}};
  for (auto [n, size] : shapes) {
    void *src = nullptr, *dst = nullptr;
    h.Check(h.api->memory_allocate(h.ctx, 0, n * size, &src), "memory_allocate");
    h.Check(h.api->memory_allocate(h.ctx, 1, n * size, &dst), "memory_allocate");
    std::vector<int64_t> shapes(n, size);
    std::vector<DLTensor> s, d;
    for (int i = 0; i < n; ++i) {
      s.push_back(Bytes(static_cast<char*>(src) + i * size, &shapes[i], 0));
      d.push_back(Bytes(static_cast<char*>(dst) + i * size, &shapes[i], 1));
    }
    constexpr uint32_t kHostOrdered = QLINK_COPY_SOURCES_READY | QLINK_COPY_SOURCES_HELD;
    for (uint32_t flags : {0u, uint32_t{QLINK_COPY_SOURCES_HELD}, kHostOrdered, uint32_t{QLINK_COPY_WAIT},
                           kHostOrdered | QLINK_COPY_WAIT}) {
      const int synchronized = (flags & QLINK_COPY_WAIT) ? -1 : 1;
      const qlink_copy_args args{sizeof(qlink_copy_args), s.data(), d.data(), s.size(), nullptr, 0, flags};
      qlink_copy_plan* plan = nullptr;
      h.Check(h.api->copy_plan_create(h.ctx, &args, &plan), "copy_plan_create");
      auto run = [&] { h.Check(h.api->copy_plan_execute(plan, nullptr, 0), "copy_plan_execute"); };
      auto fresh = [&] { h.Check(h.api->copy_batch(h.ctx, &args), "copy_batch"); };
      const std::string shape =
          std::to_string(n) + " x " + std::to_string(size >> 10) + " KiB, flags " + std::to_string(flags);
      std::printf("%-44s %12.1f %14.1f\n", ("prepared " + shape).c_str(), h.EnqueueUs(run),
                  h.CompletionUs(run, synchronized));
      std::printf("%-44s %12.1f %14.1f\n", ("fresh    " + shape).c_str(), h.EnqueueUs(fresh),
                  h.CompletionUs(fresh, synchronized));
      h.Check(h.api->copy_plan_destroy(plan), "copy_plan_destroy");
    }
    h.Check(h.api->memory_free(h.ctx, 0, src), "memory_free");
    h.Check(h.api->memory_free(h.ctx, 1, dst), "memory_free");
  }

  for (int64_t bytes : {int64_t{64} << 10, int64_t{16} << 20}) {
    void* buf[2] = {nullptr, nullptr};
    int64_t elements = bytes / 4;
    std::vector<DLTensor> b;
    for (int dev = 0; dev < 2; ++dev) {
      h.Check(h.api->memory_allocate(h.ctx, dev, bytes, &buf[dev]), "memory_allocate");
      b.push_back(Bytes(buf[dev], &elements, dev, {kDLFloat, 32, 1}));
    }
    const qlink_all_reduce_args args{sizeof(qlink_all_reduce_args), b.data(), 2, QLINK_REDUCE_SUM,
                                     QLINK_TRANSPORT_FP32,          nullptr,  0, QLINK_ALL_REDUCE_AUTO};
    qlink_all_reduce_plan* plan = nullptr;
    h.Check(h.api->all_reduce_plan_create(h.ctx, &args, &plan), "all_reduce_plan_create");
    auto run = [&] { h.Check(h.api->all_reduce_plan_execute(plan, nullptr, 0), "all_reduce_plan_execute"); };
    auto once = [&] { h.Check(h.api->all_reduce(h.ctx, &args), "all_reduce"); };
    const std::string size = std::to_string(bytes >> 10) + " KiB fp32";
    std::printf("%-44s %12.1f %14.1f\n", ("all-reduce prepared " + size).c_str(), h.EnqueueUs(run),
                h.CompletionUs(run, 1));
    std::printf("%-44s %12.1f %14.1f\n", ("all-reduce " + size).c_str(), h.EnqueueUs(once), h.CompletionUs(once, 1));
    h.Check(h.api->all_reduce_plan_destroy(plan), "all_reduce_plan_destroy");
    for (int dev = 0; dev < 2; ++dev) h.Check(h.api->memory_free(h.ctx, dev, buf[dev]), "memory_free");
  }
  h.Check(h.api->context_destroy(h.ctx), "context_destroy");
  return 0;
}
