// Place() is a pure function of the layers' shapes and the device list: a table of calls
// and the assignment each must give.
#include "quant/gptq/placement.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qlink {
namespace quant {
namespace {

struct Case {
  const char* name;
  std::vector<LayerShape> layers;
  size_t groups;
  std::vector<int> devices;
  std::vector<int> inverse_device;
  std::vector<RowsPart> parts;  // in the order Place() lists them
};

std::string Text(const std::vector<RowsPart>& parts) {
  std::string out;
  for (const RowsPart& p : parts) {
    out += "{layer " + std::to_string(p.layer) + " rows " + std::to_string(p.row_begin) + ".." +
           std::to_string(p.row_end) + " on " + std::to_string(p.device) + "} ";
  }
  return out;
}

TEST(PlaceTest, Table) {
  const std::vector<Case> cases = {
      {"no devices: each layer and its inverse on its weight's device",
       {{48, 128, 0, 2}, {128, 256, 1, 3}},
       2,
       {},
       {2, 3},
       {{0, 0, 48, 2}, {1, 0, 128, 3}}},
      {"one device takes everything, its largest part first",
       {{48, 128, 0, 0}, {128, 256, 1, 0}},
       2,
       {5},
       {5, 5},
       {{1, 0, 128, 5}, {0, 0, 48, 5}}},
      // Loads: the inverse (n^3) on device 0 first, so the first layer goes to the idle device.
      {"two equal layers sharing a Hessian on two devices: one each, the inverse's device taking the second",
       {{64, 128, 0, 0}, {64, 128, 0, 0}},
       1,
       {0, 1},
       {0},
       {{1, 0, 64, 0}, {0, 0, 64, 1}}},
      // 1000 rows: 10 tiles of 96 and one of 40.
      {"one layer over three devices: its rows split in whole tiles, the remainder on the first shares, the "
       "shortest share on the inverse's device",
       {{1000, 64, 0, 0}},
       1,
       {0, 1, 2},
       {0},
       {{0, 768, 1000, 0}, {0, 0, 384, 1}, {0, 384, 768, 2}}},
      {"more devices than tiles: one share per tile, the last one short, the inverse's device taking none",
       {{100, 64, 0, 0}},
       1,
       {0, 1, 2},
       {0},
       {{0, 0, 96, 1}, {0, 96, 100, 2}}},
      {"a layer of one tile is not split, however many devices", {{96, 64, 0, 0}}, 1, {0, 1, 2}, {0}, {{0, 0, 96, 1}}},
      // Inverses 256^3 on 0 and 128^3 on 1; layers 2.1M and 0.5M: load balance (17.2M / 4.2M)
      // beats keeping each layer beside its inverse (18.8M / 2.6M).
      {"two Hessians on two devices: the costlier inverse first, the costlier layer on the less loaded device",
       {{64, 256, 0, 0}, {64, 128, 1, 0}},
       2,
       {0, 1},
       {0, 1},
       {{1, 0, 64, 0}, {0, 0, 64, 1}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Assignment got = Place(c.layers, c.groups, c.devices);
    EXPECT_EQ(got.inverse_device, c.inverse_device);
    EXPECT_EQ(Text(got.parts), Text(c.parts));
    EXPECT_EQ(Text(Place(c.layers, c.groups, c.devices).parts), Text(got.parts)) << "the same call, placed again";
  }
}

// An MoE layer's experts on one device: gate and up share each expert's Hessian (groups
// 0..3), down has its own (4..7); four lanes.
TEST(AssignLanesTest, ExpertsSpreadByCostEachPartOnItsInversesLane) {
  std::vector<LayerShape> layers;
  for (size_t e = 0; e < 4; ++e) {
    layers.push_back({768, 2048, e, 0});      // gate
    layers.push_back({768, 2048, e, 0});      // up
    layers.push_back({2048, 768, 4 + e, 0});  // down
  }
  const Assignment placed = Place(layers, 8, {});
  const LaneAssignment lanes = AssignLanes(placed, layers, [](int) { return size_t{4}; });
  EXPECT_EQ(lanes.inverse_lane, (std::vector<size_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  ASSERT_EQ(lanes.part_lane.size(), placed.parts.size());
  for (size_t j = 0; j < placed.parts.size(); ++j) {
    EXPECT_EQ(lanes.part_lane[j], lanes.inverse_lane[layers[placed.parts[j].layer].group]) << "part " << j;
  }
  // one lane: everything on lane 0
  const LaneAssignment one = AssignLanes(placed, layers, [](int) { return size_t{1}; });
  EXPECT_EQ(one.inverse_lane, std::vector<size_t>(8, 0));
  EXPECT_EQ(one.part_lane, std::vector<size_t>(placed.parts.size(), 0));
}

// An MoE layer's Hessians in the order its experts give them (each expert's gate/up one,
// then its down one): round robin would put every large one on the even lanes; spread by
// cost, each lane gets one large and one small.
TEST(AssignLanesTest, InterleavedSizesSpreadEvenly) {
  std::vector<LayerShape> layers;
  for (size_t e = 0; e < 4; ++e) {
    layers.push_back({768, 2048, 2 * e, 0});
    layers.push_back({768, 2048, 2 * e, 0});
    layers.push_back({2048, 768, 2 * e + 1, 0});
  }
  const Assignment placed = Place(layers, 8, {});
  const LaneAssignment lanes = AssignLanes(placed, layers, [](int) { return size_t{4}; });
  EXPECT_EQ(lanes.inverse_lane, (std::vector<size_t>{0, 0, 1, 1, 2, 2, 3, 3}));
  for (size_t j = 0; j < placed.parts.size(); ++j) {
    EXPECT_EQ(lanes.part_lane[j], lanes.inverse_lane[layers[placed.parts[j].layer].group]) << "part " << j;
  }
}

// Over two devices: each device spreads its own Hessians from lane 0, and a part whose
// inverse is made on the other device goes to its own device's least loaded lane.
TEST(AssignLanesTest, EachDeviceSpreadsItsOwnAndRemotePartsGoToTheLeastLoaded) {
  const std::vector<LayerShape> layers = {{64, 256, 0, 0}, {64, 128, 1, 0}};
  const Assignment placed = Place(layers, 2, {0, 1});  // inverses 0 on 0, 1 on 1; parts 1 on 0, 0 on 1
  const LaneAssignment lanes = AssignLanes(placed, layers, [](int device) { return device == 0 ? size_t{2} : 3; });
  EXPECT_EQ(lanes.inverse_lane, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(lanes.part_lane, (std::vector<size_t>{1, 1}));  // beside the lane making the inverse
  const std::vector<LayerShape> three = {{64, 256, 0, 0}, {64, 256, 0, 0}, {64, 256, 0, 0}};
  const Assignment remote{{1}, {{0, 0, 64, 0}, {1, 0, 64, 0}, {2, 0, 64, 0}}};  // the inverse made on 1
  EXPECT_EQ(AssignLanes(remote, three, [](int) { return size_t{2}; }).part_lane, (std::vector<size_t>{0, 1, 0}));
}

}  // namespace
}  // namespace quant
}  // namespace qlink
