#include "quant/gptq/placement.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "quant/quant_math.h"

namespace qlink {
namespace quant {
namespace {

// Relative costs: the inverse is about n^3 multiply-adds (three O(n^3/3) factorizations),
// a layer's cross-block updates rows * cols^2 / 2.
double InverseCost(int64_t n) { return static_cast<double>(n) * n * n; }
double RowsCost(int64_t rows, int64_t cols) { return 0.5 * static_cast<double>(rows) * cols * cols; }

// Indices 0..n-1 sorted by cost, largest first, ties in index order.
std::vector<size_t> ByCost(const std::vector<double>& cost) {
  std::vector<size_t> order(cost.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  return order;
}

size_t LeastLoaded(const std::vector<double>& load) {
  return static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
}

}  // namespace

Assignment Place(const std::vector<LayerShape>& layers, size_t groups, const std::vector<int>& devices) {
  Assignment p;
  p.inverse_device.assign(groups, 0);
  if (devices.empty()) {
    for (size_t i = 0; i < layers.size(); ++i) {
      p.inverse_device[layers[i].group] = layers[i].device;
      p.parts.push_back({i, 0, layers[i].rows, layers[i].device});
    }
    return p;
  }
  const size_t d = devices.size();
  std::vector<double> load(d, 0.0);
  std::vector<int64_t> group_cols(groups, 0);
  for (const LayerShape& l : layers) group_cols[l.group] = l.cols;
  std::vector<double> inverse_cost(groups);
  for (size_t g = 0; g < groups; ++g) inverse_cost[g] = InverseCost(group_cols[g]);
  std::vector<size_t> inverse_slot(groups);
  for (size_t g : ByCost(inverse_cost)) {
    inverse_slot[g] = LeastLoaded(load);
    load[inverse_slot[g]] += inverse_cost[g];
    p.inverse_device[g] = devices[inverse_slot[g]];
  }

  // Shares per layer: one each, then, while devices are left over, one more for the layer
  // whose shares are the costliest; a share is whole tiles of kRowTile rows (the layer's
  // last tile may be short), so a row's products are the same calls in every world.
  std::vector<double> cost(layers.size());
  std::vector<int64_t> tiles(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    cost[i] = RowsCost(layers[i].rows, layers[i].cols);
    tiles[i] = (layers[i].rows + kRowTile - 1) / kRowTile;
  }
  std::vector<int64_t> shares(layers.size(), 1);
  for (size_t total = layers.size(); total < d; ++total) {
    size_t best = 0;
    for (size_t i = 1; i < layers.size(); ++i) {
      if (cost[i] / shares[i] > cost[best] / shares[best]) best = i;
    }
    if (shares[best] >= tiles[best]) break;
    ++shares[best];
  }
  std::vector<RowsPart> parts;
  std::vector<double> part_cost;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t rows = layers[i].rows, t = tiles[i], k = shares[i];
    int64_t begin = 0;
    for (int64_t s = 0; s < k; ++s) {  // contiguous tiles, the remainder on the earlier shares
      const int64_t end = std::min(rows, begin + (t / k + (s < t % k ? 1 : 0)) * kRowTile);
      parts.push_back({i, begin, end, 0});
      part_cost.push_back(RowsCost(end - begin, layers[i].cols));
      begin = end;
    }
  }
  std::vector<size_t> slot_of(parts.size());
  std::vector<bool> taken(d, false);
  const bool one_each = parts.size() == d;  // split layers: every device takes one share
  for (size_t j : ByCost(part_cost)) {
    size_t slot = LeastLoaded(load);
    if (one_each) {
      std::vector<double> free_load(load);
      for (size_t s = 0; s < d; ++s) free_load[s] = taken[s] ? 1e300 : load[s];
      slot = LeastLoaded(free_load);
      taken[slot] = true;
    } else {
      // Among equally loaded devices prefer the one holding this layer's inverse.
      const size_t home = inverse_slot[layers[parts[j].layer].group];
      if (load[home] <= load[slot]) slot = home;
    }
    load[slot] += part_cost[j];
    slot_of[j] = slot;
    parts[j].device = devices[slot];
  }
  // Each device runs its parts in placement order, the ones whose inverse it computes
  // first, so inverses made elsewhere have time to arrive.
  for (size_t s = 0; s < d; ++s) {
    for (bool local : {true, false}) {
      for (size_t j : ByCost(part_cost)) {
        const bool is_local = p.inverse_device[layers[parts[j].layer].group] == devices[s];
        if (slot_of[j] == s && is_local == local) p.parts.push_back(parts[j]);
      }
    }
  }
  return p;
}

LaneAssignment AssignLanes(const Assignment& placement, const std::vector<LayerShape>& layers,
                           const std::function<size_t(int)>& lanes) {
  const size_t groups = placement.inverse_device.size();
  std::vector<int64_t> group_cols(groups, 0);
  for (const LayerShape& l : layers) group_cols[l.group] = l.cols;
  // A Hessian's cost on its lane: its inverse and the parts that wait for it there.
  std::vector<double> cost(groups);
  for (size_t g = 0; g < groups; ++g) cost[g] = InverseCost(group_cols[g]);
  std::vector<bool> local(placement.parts.size());
  for (size_t j = 0; j < placement.parts.size(); ++j) {
    const RowsPart& part = placement.parts[j];
    const size_t g = layers[part.layer].group;
    local[j] = placement.inverse_device[g] == part.device;
    if (local[j]) cost[g] += RowsCost(part.row_end - part.row_begin, layers[part.layer].cols);
  }
  std::map<int, std::vector<double>> load;  // per device, per lane
  auto lane_for = [&](int device, double work) {
    std::vector<double>& l = load[device];
    if (l.empty()) l.assign(std::max<size_t>(lanes(device), 1), 0.0);
    const size_t lane = LeastLoaded(l);
    l[lane] += work;
    return lane;
  };
  LaneAssignment out;
  out.inverse_lane.assign(groups, 0);
  for (size_t g : ByCost(cost)) out.inverse_lane[g] = lane_for(placement.inverse_device[g], cost[g]);
  out.part_lane.assign(placement.parts.size(), 0);
  for (size_t j = 0; j < placement.parts.size(); ++j) {
    const RowsPart& part = placement.parts[j];
    out.part_lane[j] = local[j]
                           ? out.inverse_lane[layers[part.layer].group]
                           : lane_for(part.device, RowsCost(part.row_end - part.row_begin, layers[part.layer].cols));
  }
  return out;
}

}  // namespace quant
}  // namespace qlink
