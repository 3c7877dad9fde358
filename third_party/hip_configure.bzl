"""Finds Debian's HIP runtime headers and hipcc (packages libamdhip64-dev, hipcc).

Without them, @local_hip still exists with HIP_FOUND = False, and the HIP backend is
simply not built."""

def _hip_configure_impl(rctx):
    found = rctx.path("/usr/bin/hipcc").exists and rctx.path("/usr/include/hip/hip_runtime_api.h").exists
    rctx.file("BUILD", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "hip_runtime",
    defines = ["__HIP_PLATFORM_AMD__"],
    linkopts = ["-lamdhip64"],
)
""" if found else "")
    rctx.file("defs.bzl", "HIP_FOUND = %s\nHIPCC = \"/usr/bin/hipcc\"\n" % found)

hip_configure = repository_rule(implementation = _hip_configure_impl, local = True)
