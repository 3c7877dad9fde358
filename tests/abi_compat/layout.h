// The ABI 1.0 layout facts a host relies on, as "name -> value" text: struct field
// offsets and sizes, the 1.0 struct sizes, enum values, function-table slots and their
// types. Computed once against the frozen 1.0 header and once against the live one;
// the test compares the two.
#pragma once

#include <map>
#include <string>

namespace qlink_abi {

using Layout = std::map<std::string, std::string>;

Layout FrozenLayout();  // tests/abi_fixture/qlink_1_0.h
Layout LiveLayout();    // plugin_api/qlink.h

}  // namespace qlink_abi
