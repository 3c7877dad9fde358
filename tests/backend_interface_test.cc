// Core loads a backend library only when it was built against this build's backend
// interface (backends/device_backend.h): anything else is refused, naming both interface
// versions, before any of its code runs (the fakes' factories abort). What core hands a
// backend it accepts arrives intact.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backends/device_backend.h"
#include "tests/host/plugin.h"

namespace qlink_test {
namespace {

using ::testing::HasSubstr;

class BackendInterface : public ::testing::Test {
 protected:
  // context_create with `backend` at `path` must fail with UNAVAILABLE; gives the message.
  std::string Refusal(const std::string& path, const std::string& more_config = "") {
    const std::string config = R"({"backend": ")" + RunfilePath(path) + "\"" + more_config + "}";
    qlink_context* ctx = reinterpret_cast<qlink_context*>(0x1);
    EXPECT_EQ(api_.context_create(config.c_str(), &ctx), QLINK_UNAVAILABLE) << config;
    EXPECT_EQ(ctx, nullptr);
    return api_.last_error();
  }

  Plugin plugin_;
  const qlink_api& api_ = plugin_.api();
  const std::string ours = std::to_string(QLINK_BACKEND_INTERFACE_VERSION);

  // What core says of a library built against interface version `theirs`: both versions,
  // each in its role.
  std::string Mismatch(uint32_t theirs) {
    return "implements backend interface version " + std::to_string(theirs) + ", this libqlink.so needs version " +
           ours + " (rebuild the backend with this qlink)";
  }
};

TEST_F(BackendInterface, RefusesAnotherInterfaceVersion) {
  const std::string error = Refusal("tests/fake_backends/libfake_backend_next_version.so");
  EXPECT_THAT(error, HasSubstr(Mismatch(QLINK_BACKEND_INTERFACE_VERSION + 1)));
}

// A backend built before the last bump (at interface 6, one of interface 5, whose
// SignRoundMath has no experts' calls for this core's ABI 1.10 entry points to make).
TEST_F(BackendInterface, RefusesAnOlderInterfaceVersion) {
  const std::string error = Refusal("tests/fake_backends/libfake_backend_previous_version.so");
  EXPECT_THAT(error, HasSubstr(Mismatch(QLINK_BACKEND_INTERFACE_VERSION - 1)));
}

TEST_F(BackendInterface, RefusesALibraryWithoutAVersion) {
  const std::string error = Refusal("tests/fake_backends/libfake_backend_unversioned.so");
  EXPECT_THAT(error, HasSubstr("does not export qlink_backend_interface_version"));
  EXPECT_THAT(error, HasSubstr("version " + ours));
}

TEST_F(BackendInterface, HandsTheBackendEveryOption) {
  const std::string error = Refusal("tests/fake_backends/libfake_backend_echo.so",
                                    R"(, "cpu_devices": 7, "backend_options": {"a": [1]},)"
                                    R"( "blas_library": "libblas-x.so", "solver_library": "/opt/solver.so")");
  EXPECT_THAT(error, HasSubstr("refused to start: echo: virtual_devices 7, options_json {\"a\":[1]}, "
                               "blas_library 'libblas-x.so', solver_library '/opt/solver.so'"));
}

TEST_F(BackendInterface, LibraryDefaultsAreEmpty) {
  const std::string error = Refusal("tests/fake_backends/libfake_backend_echo.so");
  EXPECT_THAT(error, HasSubstr("virtual_devices 4, options_json {}, blas_library '', solver_library ''"));
}

}  // namespace
}  // namespace qlink_test
