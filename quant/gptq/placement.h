// Where a multi-layer GPTQ call runs: each Hessian's inverse on one device, each layer
// (or, when devices outnumber layers, each share of a layer's rows, in whole tiles of
// kRowTile rows: quant/quant_math.h) on one device, by a longest-processing-time-first
// split of the work's cost. A pure function of the shapes and the device list, so every
// run of the same call is placed the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace qlink {
namespace quant {

struct LayerShape {
  int64_t rows = 0, cols = 0;
  size_t group = 0;  // index of its Hessian among the call's distinct Hessians
  int device = 0;    // where its weight lives
};

struct RowsPart {
  size_t layer = 0;
  int64_t row_begin = 0, row_end = 0;
  int device = 0;
};

// Where each piece of a call's work runs (qlink.quant.Placement, in Python, is a set of
// replica devices: another thing).
struct Assignment {
  std::vector<int> inverse_device;  // per Hessian
  std::vector<RowsPart> parts;      // per device: the parts whose inverse is local first
};

// devices empty: every layer, and its Hessian's inverse, on the weight's device.
Assignment Place(const std::vector<LayerShape>& layers, size_t groups, const std::vector<int>& devices);

// Which lane of its device runs each inverse and each row part of an Assignment (lanes:
// streams of one device the engine runs at once, each in a thread of its own).
struct LaneAssignment {
  std::vector<size_t> inverse_lane;  // per Hessian, like Assignment::inverse_device
  std::vector<size_t> part_lane;     // per part, like Assignment::parts
};

// A device's Hessians spread over its lanes longest first, each to the least loaded lane (a
// Hessian's load: its inverse and the parts on its device that need it; an MoE layer's
// Hessians alternate between two sizes, so dealing them round robin would load some lanes
// with only the large ones), each part on the lane of its Hessian where that inverse is
// made on the part's device (it then needs no other lane's), the other parts on the least
// loaded lane in order. lanes(device): how many the device has (>= 1).
LaneAssignment AssignLanes(const Assignment& placement, const std::vector<LayerShape>& layers,
                           const std::function<size_t(int)>& lanes);

}  // namespace quant
}  // namespace qlink
