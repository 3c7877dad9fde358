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
      {"one layer over three devices: its rows split, the remainder on the first share, which avoids the "
       "inverse's device",
       {{10, 64, 0, 0}},
       1,
       {0, 1, 2},
       {0},
       {{0, 7, 10, 0}, {0, 0, 4, 1}, {0, 4, 7, 2}}},
      {"more devices than rows: one share per row, the inverse's device taking none",
       {{2, 64, 0, 0}},
       1,
       {0, 1, 2},
       {0},
       {{0, 0, 1, 1}, {0, 1, 2, 2}}},
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

}  // namespace
}  // namespace quant
}  // namespace qlink
