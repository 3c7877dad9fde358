// Fails when the live header changes anything a 1.0 host depends on: a field's offset,
// size or type, a 1.0 struct size, an enum value, a function-table slot or its signature.
// Appending fields, enumerators or table entries keeps it green.
#include <gtest/gtest.h>

#include "tests/abi_compat/layout.h"

namespace qlink_abi {
namespace {

TEST(AbiLayout, LiveHeaderKeepsEveryOneZeroFact) {
  const Layout frozen = FrozenLayout();
  const Layout live = LiveLayout();
  ASSERT_GT(frozen.size(), 150u);
  for (const auto& [name, value] : frozen) {
    auto it = live.find(name);
    ASSERT_NE(it, live.end()) << name;
    EXPECT_EQ(it->second, value) << name << " changed since ABI 1.0";
  }
}

}  // namespace
}  // namespace qlink_abi
