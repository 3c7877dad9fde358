#include "tests/host/runfiles.h"

#include <memory>
#include <stdexcept>

#include "tools/cpp/runfiles/runfiles.h"

namespace qlink_test {

std::string RunfilePath(const std::string& workspace_relative) {
  std::string error;
  static std::unique_ptr<bazel::tools::cpp::runfiles::Runfiles> runfiles(
      bazel::tools::cpp::runfiles::Runfiles::CreateForTest(&error));
  if (!runfiles) throw std::runtime_error("runfiles: " + error);
  return runfiles->Rlocation("qlink/" + workspace_relative);
}

}  // namespace qlink_test
