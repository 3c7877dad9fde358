// `qlink`: the command-line host of libqlink.so.
//   qlink probe [--config JSON] [--bytes N]   backend, devices, peer matrix, bandwidth and latency
//   qlink demo  [--config JSON]               a module-shaped batch around every device, verified;
//                                             a small Llama-shaped model quantized (GPTQ) data-parallel
// The plugin is dlopen'ed from the folder this program lives in (or --library PATH),
// exactly as a Python host would load it.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "plugin_api/qlink.h"
#include "tools/gptq_demo.h"

namespace {

struct Options {
  std::string command;
  std::string config = "{}";
  std::string library;
  uint64_t bytes = 32ull << 20;
};

int Usage() {
  std::fprintf(stderr,
               "usage: qlink probe|demo [--config JSON] [--library PATH] [--bytes N]\n"
               "  probe  backend, devices, peer matrix, copy bandwidth (GB/s) and latency per ordered pair\n"
               "  demo   move a 64-leaf module batch around every device and verify it byte for byte,\n"
               "         then quantize a small Llama-shaped model with GPTQ, serially and data-parallel\n");
  return 2;
}

bool Parse(int argc, char** argv, Options* o) {
  if (argc < 2) return false;
  o->command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) return false;
    std::string value = argv[++i];
    if (flag == "--config") {
      o->config = value;
    } else if (flag == "--library") {
      o->library = value;
    } else if (flag == "--bytes") {
      o->bytes = std::stoull(value);
    } else {
      return false;
    }
  }
  return o->command == "probe" || o->command == "demo";
}

// Exits with the plugin's message when a call fails.
class Checked {
 public:
  explicit Checked(const qlink_api& api) : api_(api) {}
  void operator()(qlink_status s, const char* what) const {
    if (s == QLINK_OK) return;
    std::fprintf(stderr, "qlink: %s failed (status %d): %s\n", what, static_cast<int>(s), api_.last_error());
    std::exit(1);
  }

 private:
  const qlink_api& api_;
};

const char* PeerStateName(int32_t state) {
  switch (state) {
    case QLINK_PEER_NOT_APPLICABLE:
      return "n/a";
    case QLINK_PEER_NOT_REQUESTED:
      return "not requested";
    case QLINK_PEER_DISABLED:
      return "disabled";
    case QLINK_PEER_UNSUPPORTED:
      return "unsupported";
    case QLINK_PEER_ENABLE_FAILED:
      return "enable failed";
    case QLINK_PEER_PROBE_REJECTED:
      return "probe rejected";
    case QLINK_PEER_ENABLED:
      return "enabled";
    default:
      return "?";
  }
}

int Probe(const qlink_api& api, qlink_context* ctx, const Options& o) {
  Checked check(api);
  const char* backend = nullptr;
  int32_t n = 0;
  check(api.backend_name(ctx, &backend), "backend_name");
  check(api.device_count(ctx, &n), "device_count");
  std::printf("backend: %s, %d device(s)\n", backend, n);
  std::vector<int32_t> all;
  for (int32_t d = 0; d < n; ++d) {
    qlink_device_info info{};
    info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
    check(api.device_info(ctx, d, &info), "device_info");
    std::printf("  device %d: %s, %.1f GiB total, %.1f GiB free\n", d, info.name, info.total_bytes / 1073741824.0,
                info.free_bytes / 1073741824.0);
    all.push_back(d);
  }
  check(api.enable_peer_access(ctx, all.data(), all.size()), "enable_peer_access");

  std::printf("\npeer matrix (row = source, column = destination)\n%8s", "");
  for (int32_t d = 0; d < n; ++d) std::printf("%16d", d);
  std::printf("\n");
  std::vector<std::string> reasons;
  for (int32_t s = 0; s < n; ++s) {
    std::printf("%8d", s);
    for (int32_t d = 0; d < n; ++d) {
      qlink_peer_info p{};
      p.struct_size = QLINK_PEER_INFO_STRUCT_SIZE;
      check(api.peer_info(ctx, s, d, &p), "peer_info");
      std::printf("%16s", PeerStateName(p.state));
      if (p.reason[0] != '\0' && s != d)
        reasons.push_back(std::to_string(s) + "->" + std::to_string(d) + ": " + p.reason);
    }
    std::printf("\n");
  }
  if (!reasons.empty()) std::printf("  e.g. %s\n", reasons.front().c_str());

  std::vector<qlink_link_measurement> m(static_cast<size_t>(n) * n);
  for (int32_t s = 0; s < n; ++s) {
    for (int32_t d = 0; d < n; ++d) {
      qlink_link_measurement& x = m[static_cast<size_t>(s) * n + d];
      x.struct_size = QLINK_LINK_MEASUREMENT_STRUCT_SIZE;
      check(api.measure_link(ctx, s, d, o.bytes, &x), "measure_link");
    }
  }
  std::printf("\ncopy bandwidth, GB/s (1e9 B/s), %llu-byte copies\n%8s", static_cast<unsigned long long>(o.bytes), "");
  for (int32_t d = 0; d < n; ++d) std::printf("%10d", d);
  std::printf("\n");
  for (int32_t s = 0; s < n; ++s) {
    std::printf("%8d", s);
    for (int32_t d = 0; d < n; ++d) std::printf("%10.1f", m[static_cast<size_t>(s) * n + d].gbps);
    std::printf("\n");
  }
  std::printf("\nlatency of a 4 KiB copy, us\n%8s", "");
  for (int32_t d = 0; d < n; ++d) std::printf("%10d", d);
  std::printf("\n");
  for (int32_t s = 0; s < n; ++s) {
    std::printf("%8d", s);
    for (int32_t d = 0; d < n; ++d) std::printf("%10.2f", m[static_cast<size_t>(s) * n + d].latency_us);
    std::printf("\n");
  }
  return 0;
}

// Moves 64 leaves (4 KiB .. 1 MiB, odd sizes included) from device 0 to 1, 1 to 2, ...,
// back to 0, then checks the bytes that came home.
int Demo(const qlink_api& api, qlink_context* ctx) {
  Checked check(api);
  int32_t n = 0;
  check(api.device_count(ctx, &n), "device_count");
  const char* backend = nullptr;
  check(api.backend_name(ctx, &backend), "backend_name");
  std::vector<int32_t> all;
  for (int32_t d = 0; d < n; ++d) all.push_back(d);
  check(api.enable_peer_access(ctx, all.data(), all.size()), "enable_peer_access");

  constexpr int kLeaves = 64;
  std::vector<int64_t> sizes(kLeaves);
  uint64_t total = 0;
  for (int i = 0; i < kLeaves; ++i) total += sizes[i] = (4096 << (i % 9)) + (i % 3 == 0 ? 17 : 0);
  // hops + 1 buffers per leaf: one per device on the way round, the last back on device 0.
  const int hops = n > 1 ? n : 1;
  std::vector<std::vector<void*>> buf(hops + 1, std::vector<void*>(kLeaves));
  auto device_of = [&](int hop) { return hop % n; };
  std::vector<uint8_t> pattern;
  for (int h = 0; h <= hops; ++h) {
    for (int i = 0; i < kLeaves; ++i)
      check(api.memory_allocate(ctx, device_of(h), sizes[i], &buf[h][i]), "memory_allocate");
  }
  for (int i = 0; i < kLeaves; ++i) {
    pattern.resize(sizes[i]);
    for (int64_t b = 0; b < sizes[i]; ++b) pattern[b] = static_cast<uint8_t>(b * 131 + i * 7);
    check(api.memory_from_host(ctx, 0, buf[0][i], pattern.data(), sizes[i]), "memory_from_host");
  }
  qlink_device_info info{};
  info.struct_size = QLINK_DEVICE_INFO_STRUCT_SIZE;
  check(api.device_info(ctx, 0, &info), "device_info");
  auto tensor = [&](void* data, int device, const int64_t* shape) {
    info.device.device_id = device;
    return DLTensor{data, info.device, 1, DLDataType{kDLUInt, 8, 1}, const_cast<int64_t*>(shape), nullptr, 0};
  };
  double seconds = 0;
  for (int h = 0; h < hops; ++h) {
    std::vector<DLTensor> src, dst;
    for (int i = 0; i < kLeaves; ++i) {
      src.push_back(tensor(buf[h][i], device_of(h), &sizes[i]));
      dst.push_back(tensor(buf[h + 1][i], device_of(h + 1), &sizes[i]));
    }
    qlink_copy_args args{QLINK_COPY_ARGS_STRUCT_SIZE, src.data(), dst.data(), src.size(), nullptr, 0};
    auto t0 = std::chrono::steady_clock::now();
    check(api.copy_batch(ctx, &args), "copy_batch");
    check(api.stream_synchronize(ctx, device_of(h + 1), nullptr), "stream_synchronize");
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  int bad = 0;
  std::vector<uint8_t> back;
  for (int i = 0; i < kLeaves; ++i) {
    back.resize(sizes[i]);
    check(api.memory_to_host(ctx, 0, back.data(), buf[hops][i], sizes[i]), "memory_to_host");
    for (int64_t b = 0; b < sizes[i]; ++b) bad += back[b] != static_cast<uint8_t>(b * 131 + i * 7);
  }
  for (int h = 0; h <= hops; ++h) {
    for (int i = 0; i < kLeaves; ++i) check(api.memory_free(ctx, device_of(h), buf[h][i]), "memory_free");
  }
  std::printf(
      "demo: backend %s, %d leaves (%.1f MiB) moved around %d device(s) in %d batch(es), %.3f ms, %.1f GB/s: %s\n",
      backend, kLeaves, total / 1048576.0, n, hops, seconds * 1e3, total * hops / seconds / 1e9,
      bad == 0 ? "byte-exact" : "CORRUPTED");
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) return Usage();
  const auto path = o.library.empty() ? boost::dll::program_location().parent_path() / "libqlink.so"
                                      : boost::dll::fs::path(o.library);
  boost::dll::fs::error_code ec;
  boost::dll::shared_library lib(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec) {
    std::fprintf(stderr, "qlink: cannot load %s: %s\n", path.string().c_str(), ec.message().c_str());
    return 1;
  }
  const char* error = nullptr;
  const qlink_api* api = lib.get<const qlink_api*(uint32_t, uint32_t, const char**)>("qlink_get_api")(
      QLINK_ABI_MAJOR, QLINK_ABI_MINOR, &error);
  if (api == nullptr) {
    std::fprintf(stderr, "qlink: %s\n", error);
    return 1;
  }
  qlink_context* ctx = nullptr;
  Checked check(*api);
  check(api->context_create(o.config.c_str(), &ctx), "context_create");
  const int rc = o.command == "probe" ? Probe(*api, ctx, o) : Demo(*api, ctx) | GptqDemo(*api, ctx);
  api->context_destroy(ctx);
  return rc;
}
