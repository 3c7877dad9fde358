#include "quant/gptq/gptq_quantize.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include <spdlog/spdlog.h>

#include "core/stream_list.h"
#include "core/tensor_check.h"
#include "quant/gptq/engine_math.h"
#include "quant/gptq/placement.h"
#include "quant/gptq/solve_rows.h"

namespace qlink {
namespace quant {
namespace {

// The inverses of one call as their devices finish them: layers placed elsewhere wait
// for theirs, and no output is written until every inverse is known to exist.
class InverseBoard {
 public:
  explicit InverseBoard(size_t groups) : inverses_(groups), pending_(groups) {}

  void Publish(size_t group, std::unique_ptr<HessianInverse> inverse) {
    std::lock_guard<std::mutex> lock(mu_);
    inverses_[group] = std::move(inverse);
    --pending_;
    cv_.notify_all();
  }
  void Fail() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }
  // The group's inverse once made, or NULL when the call failed first.
  const HessianInverse* Await(size_t group) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return failed_ || inverses_[group] != nullptr; });
    return failed_ ? nullptr : inverses_[group].get();
  }
  // Whether every inverse was made (waits until known).
  bool AllMade() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return failed_ || pending_ == 0; });
    return !failed_;
  }
  const HessianInverse& Get(size_t group) const { return *inverses_[group]; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<HessianInverse>> inverses_;
  size_t pending_;
  bool failed_ = false;
};

double Milliseconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// A device's lanes at most: an MoE layer's expert solves (cuSOLVER calls, latency-bound at
// these sizes) overlap on lanes, eight the most measured (bench/RESULTS.md).
constexpr size_t kMaxLanes = 8;

struct Work {
  Context* ctx;
  QuantMath* math;
  GptqOptions options;
  std::vector<Layer> layers;
  std::vector<size_t> group_of;           // per layer
  std::vector<size_t> group_first_layer;  // per group: its first layer, for messages
  Assignment placement;
  LaneAssignment lanes;
  const qlink_stream* streams;
  size_t num_streams;
  std::vector<std::vector<double>> row_loss;  // per layer, per row
};

// One thread of the call: a lane of a device, on its stream.
struct Worker {
  int device;
  size_t lane;
  Stream stream;
};

// One lane's share of the call: its inverses, then its rows.
Status RunLane(Work& work, InverseBoard& board, const Worker& worker, Workspace* workspace) {
  DeviceBackend& backend = work.ctx->backend();
  const int device = worker.device;
  const Stream stream = worker.stream;
  for (size_t g = 0; g < work.placement.inverse_device.size(); ++g) {
    if (work.placement.inverse_device[g] != device || work.lanes.inverse_lane[g] != worker.lane) continue;
    const Layer& first = work.layers[work.group_first_layer[g]];
    std::string who = first.name;
    size_t sharing = 0;
    for (size_t i = 0; i < work.layers.size(); ++i) sharing += work.group_of[i] == g ? 1 : 0;
    if (sharing > 1) who += " (and " + std::to_string(sharing - 1) + " more layers sharing its Hessian)";
    // A Hessian kept on another device is copied here first.
    const float* h = reinterpret_cast<const float*>(DataOf(*first.hessian));
    DeviceBuffer staged;
    if (first.device != device) {
      const uint64_t bytes = sizeof(float) * first.cols * first.cols;
      QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, bytes, &staged));
      const CopyLeaf leaf{h, staged.as<float>(), bytes};
      QLINK_RETURN_IF_ERROR(backend.CopyLeaves(device, first.device, &leaf, 1, stream));
      h = staged.as<float>();
    }
    auto inverse = std::make_unique<HessianInverse>();
    const auto start = std::chrono::steady_clock::now();
    QLINK_RETURN_IF_ERROR(
        InvertHessian(backend, *work.math, device, stream, h, first.cols, work.options, who, workspace, inverse.get()));
    work.ctx->log().debug("gptq: inverse for {} ({} columns) on device {}: {:.2f} ms, damp {}", who, first.cols, device,
                          Milliseconds(start), inverse->damp);
    board.Publish(g, std::move(inverse));
  }
  std::map<size_t, HessianInverse> copies;  // inverses made on another device, copied here once
  for (size_t j = 0; j < work.placement.parts.size(); ++j) {
    const RowsPart& part = work.placement.parts[j];
    if (part.device != device || work.lanes.part_lane[j] != worker.lane) continue;
    const size_t g = work.group_of[part.layer];
    const HessianInverse* inverse = board.Await(g);
    if (inverse == nullptr) return Status::Ok();  // another device failed: stop quietly
    if (inverse->device != device) {
      auto [it, fresh] = copies.try_emplace(g);
      if (fresh) QLINK_RETURN_IF_ERROR(CopyInverse(backend, *inverse, device, stream, workspace, &it->second));
      inverse = &it->second;
    }
    const Layer& layer = work.layers[part.layer];
    RowsJob job{&layer, part.row_begin, part.row_end,
                device, stream,         StreamFor(layer.device, work.streams, work.num_streams)};
    std::vector<double> loss;
    const auto start = std::chrono::steady_clock::now();
    QLINK_RETURN_IF_ERROR(SolveRows(
        backend, *work.math, *inverse, job, work.options, [&] { return board.AllMade(); }, workspace, &loss));
    work.ctx->log().debug("gptq: rows {}..{} of {} on device {}: {:.2f} ms", part.row_begin, part.row_end, layer.name,
                          device, Milliseconds(start));
    std::copy(loss.begin(), loss.end(), work.row_loss[part.layer].begin() + part.row_begin);
  }
  return Status::Ok();
}

}  // namespace

Status GptqQuantize(Context& ctx, qlink_gptq_args* args) {
  const auto start = std::chrono::steady_clock::now();
  if (args == nullptr) return InvalidArgument("args is NULL");
  QLINK_RETURN_IF_ERROR(CheckStructSize(args->struct_size, QLINK_GPTQ_ARGS_STRUCT_SIZE_1_4, "args", "1.4"));
  Work work{&ctx};
  QLINK_RETURN_IF_ERROR(ReadOptions(args->options, &work.options));
  if (args->num_layers > 0 && args->layers == nullptr)
    return InvalidArgument("args->layers is NULL with num_layers > 0");
  if (args->num_devices > 0 && args->devices == nullptr) {
    return InvalidArgument("args->devices is NULL with num_devices > 0");
  }
  QLINK_RETURN_IF_ERROR(CheckStreams(ctx, args->streams, args->num_streams));
  std::vector<int> devices;
  for (size_t i = 0; i < args->num_devices; ++i) {
    const std::string what = "args->devices[" + std::to_string(i) + "]";
    QLINK_RETURN_IF_ERROR(ctx.CheckDevice(args->devices[i], what.c_str()));
    if (std::find(devices.begin(), devices.end(), args->devices[i]) != devices.end()) {
      return InvalidArgument(what + " = " + std::to_string(args->devices[i]) + " is listed twice");
    }
    devices.push_back(args->devices[i]);
  }
  work.layers.resize(args->num_layers);
  // Layers given one Hessian (the same bytes of one device) share its inverse.
  std::map<std::tuple<int, const void*>, size_t> hessians;
  for (size_t i = 0; i < args->num_layers; ++i) {
    Layer& layer = work.layers[i];
    QLINK_RETURN_IF_ERROR(ReadLayer(ctx, args->layers[i], i, work.options, &layer));
    auto [it, fresh] = hessians.try_emplace({layer.device, DataOf(*layer.hessian)}, hessians.size());
    work.group_of.push_back(it->second);
    if (fresh) work.group_first_layer.push_back(i);
  }
  if (work.layers.empty()) return Status::Ok();
  QLINK_RETURN_IF_ERROR(GetEngineMath(ctx, &work.math));

  std::vector<LayerShape> shapes;
  for (size_t i = 0; i < work.layers.size(); ++i) {
    shapes.push_back({work.layers[i].rows, work.layers[i].cols, work.group_of[i], work.layers[i].device});
  }
  work.placement = Place(shapes, hessians.size(), devices);
  work.streams = args->streams;
  work.num_streams = args->num_streams;
  for (const Layer& l : work.layers) work.row_loss.emplace_back(static_cast<size_t>(l.rows), 0.0);

  // Every device that holds a layer or runs a share: the host's work there first.
  std::vector<int> involved(devices);
  for (const Layer& l : work.layers) involved.push_back(l.device);
  std::sort(involved.begin(), involved.end());
  involved.erase(std::unique(involved.begin(), involved.end()), involved.end());
  DeviceBackend& backend = ctx.backend();
  for (int d : involved)
    QLINK_RETURN_IF_ERROR(backend.SynchronizeStream(d, StreamFor(d, args->streams, args->num_streams)));

  std::vector<int> busy;  // the devices with work
  for (const RowsPart& p : work.placement.parts) busy.push_back(p.device);
  for (int d : work.placement.inverse_device) busy.push_back(d);
  std::sort(busy.begin(), busy.end());
  busy.erase(std::unique(busy.begin(), busy.end()), busy.end());
  // A device making several inverses runs its share on lanes of the math's own, as many as
  // it has Hessians up to kMaxLanes (the host's stream was waited for above, and every lane
  // waits for its own work before the call returns); else on the host's stream.
  std::map<int, std::vector<Stream>> lane_streams;
  for (int d : busy) {
    const size_t inverses =
        static_cast<size_t>(std::count(work.placement.inverse_device.begin(), work.placement.inverse_device.end(), d));
    std::vector<Stream>& streams = lane_streams[d];
    if (inverses > 1) QLINK_RETURN_IF_ERROR(work.math->LaneStreams(d, std::min(inverses, kMaxLanes), &streams));
    if (streams.empty()) streams.push_back(StreamFor(d, args->streams, args->num_streams));
  }
  work.lanes = AssignLanes(work.placement, shapes, [&](int d) { return lane_streams[d].size(); });
  std::vector<Worker> workers;
  for (int d : busy) {
    for (size_t lane = 0; lane < lane_streams[d].size(); ++lane) workers.push_back({d, lane, lane_streams[d][lane]});
  }
  std::deque<Workspace> workspaces;  // outlive every buffer, the board's too
  for (const Worker& w : workers) workspaces.emplace_back(ctx.scratch(), w.device, w.stream);
  InverseBoard board(hessians.size());
  std::vector<Status> results(workers.size());
  {
    std::vector<std::thread> threads;
    for (size_t k = 0; k < workers.size(); ++k) {
      threads.emplace_back([&, k] {
        try {
          results[k] = RunLane(work, board, workers[k], &workspaces[k]);
        } catch (const std::bad_alloc&) {
          results[k] = OutOfMemory("host memory exhausted");
        } catch (const std::exception& e) {
          results[k] = Internal(std::string("unexpected exception: ") + e.what());
        }
        if (!results[k].ok()) board.Fail();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  // A failed call leaves nothing queued on its lanes: the caller frees or reuses the outputs
  // at once (the Python side retries a batch that ran out of memory in halves), and a lane
  // that stopped early may still have kernels writing them and the workspaces.
  if (std::any_of(results.begin(), results.end(), [](const Status& s) { return !s.ok(); })) {
    for (const Worker& w : workers) (void)backend.SynchronizeStream(w.device, w.stream);
  }
  // A refusal (an indefinite Hessian) before any other failure: it is what the host can act on.
  for (const Status& s : results) {
    if (s.code() == QLINK_INVALID_ARGUMENT) return s;
  }
  for (const Status& s : results) QLINK_RETURN_IF_ERROR(s);

  for (size_t i = 0; i < work.layers.size(); ++i) {
    const Layer& layer = work.layers[i];
    const HessianInverse& inverse = board.Get(work.group_of[i]);
    if (layer.g_idx != nullptr) {
      const std::vector<int32_t> g = GroupIndex(inverse, work.options);
      QLINK_RETURN_IF_ERROR(
          backend.CopyFromHost(layer.device, MutableDataOf(*layer.g_idx), g.data(), sizeof(int32_t) * g.size()));
    }
    double sum = 0;
    for (double v : work.row_loss[i]) sum += v;
    sum /= 2;
    args->layers[i].loss = work.options.nsamples > 0 ? sum / work.options.nsamples : sum;
    args->layers[i].damp = inverse.damp;
  }
  std::map<int, uint64_t> device_peak;  // the lanes' peaks added: an upper bound
  for (const Workspace& u : workspaces) device_peak[u.device] += u.peak.load();
  uint64_t peak = 0;
  for (const auto& [device, bytes] : device_peak) peak = std::max(peak, bytes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ctx.log().info(
      "gptq: {} layer(s), {} Hessian(s) on {} device(s), {} lane(s), in {:.3f} s; peak workspace {:.1f} MiB on one "
      "device",
      work.layers.size(), hessians.size(), busy.size(), workers.size(), seconds, peak / 1048576.0);
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
