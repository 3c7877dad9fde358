// The layout measured against the frozen 1.0 header (never the live one in this file).
#include <cstddef>
#include <string>
#include <typeinfo>

#include "tests/abi_compat/layout.h"
#include "tests/abi_fixture/qlink_1_0.h"

namespace qlink_abi {

Layout FrozenLayout() {
#include "tests/abi_compat/layout_body.inc"
}

}  // namespace qlink_abi
