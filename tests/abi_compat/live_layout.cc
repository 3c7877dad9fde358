// The layout measured against the live header.
#include <cstddef>
#include <string>
#include <typeinfo>

#include "plugin_api/qlink.h"
#include "tests/abi_compat/layout.h"

namespace qlink_abi {

Layout LiveLayout() {
#include "tests/abi_compat/layout_body.inc"
}

}  // namespace qlink_abi
