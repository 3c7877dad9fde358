// Finds the built files a test carries (libqlink.so, backends) in its Bazel runfiles.
// Free of qlink.h, so hosts built against a frozen ABI header can use it too.
#pragma once

#include <string>

namespace qlink_test {

// Path of a file of this workspace in the test's runfiles ("libqlink.so", ...).
std::string RunfilePath(const std::string& workspace_relative);

}  // namespace qlink_test
