"""The GPU backend built once per vendor from one source: nvcc for CUDA, hipcc for HIP,
each defined only where its toolkit was found (no rules_cuda: a genrule per kernel)."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")
load("@local_hip//:defs.bzl", "HIP_FOUND", "HIPCC")

_KERNELS = {
    "pull_kernel": "//backends/gpu:pull_kernel.cu",
    "collective_kernels": "//backends/gpu:collective_kernels.cu",
    "gptq_kernels": "//quant/kernels:gptq_kernels.cu",
    "signround_kernels": "//quant/kernels:signround_kernels.cu",
}

# Kernels written for one vendor's hardware alone (their callers are guarded the same way).
_CUDA_KERNELS = {
    # mma.sync and ldmatrix in PTX: HIP keeps hipBLAS's GemmEx for the tensor precision.
    "hessian_kernels": "//quant/kernels:hessian_kernels.cu",
}

_HDRS = [
    "//backends/gpu:collective_kernels.h",
    "//backends/gpu:gpu_device.h",
    "//backends/gpu:gpu_runtime.h",
    "//backends/gpu:gpu_status.h",
    "//backends/gpu:pull_kernel.h",
    "//backends:device_backend.h",
    "//backends:status.h",
    "//plugin_api:qlink.h",
    "//quant:quant_math.h",
    "//quant/kernels:gptq_kernels.h",
    "//quant/kernels:gptq_math.h",
    "//quant/kernels:hessian_kernels.h",
    "//quant/kernels:gpu_team.h",
    "//quant/kernels:signround_kernels.h",
    "//quant/kernels:signround_math.h",
    "//quant/signround:signround_math_api.h",
]

# The GPTQ engine's host side, compiled with the vendor's define like the backend.
_QUANT_SRCS = [
    "//quant/gpu:gpu_quant_math.cc",
    "//quant/gpu:linalg_api.cc",
    "//quant/gpu:gpu_signround.cc",
]

_QUANT_HDRS = [
    "//quant/gpu:gpu_quant_math.h",
    "//quant/gpu:linalg_api.h",
    "//quant/gpu:gpu_signround.h",
]

# sm_80 (A100), sm_90 (H100/H200) and PTX for later NVIDIA GPUs.
_NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "-Xcompiler -fPIC",
    "-DQLINK_GPU_CUDA",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# MI100 (gfx908), MI200 (gfx90a) and RDNA2 (gfx1030): what Debian's ROCm 5.2 device
# libraries cover.
_HIPCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "-fPIC",
    "-DQLINK_GPU_HIP",
    "-D__HIP_PLATFORM_AMD__",
    "--offload-arch=gfx908",
    "--offload-arch=gfx90a",
    "--offload-arch=gfx1030",
    "-x hip",
]

_VENDORS = {
    "cuda": struct(found = CUDA_FOUND, compiler = NVCC, flags = _NVCC_FLAGS, define = "QLINK_GPU_CUDA",
                   kernels = dict(_KERNELS, **_CUDA_KERNELS),
                   deps = ["@local_cuda//:cuda_headers", "@local_cuda//:cudart_static"]),
    "hip": struct(found = HIP_FOUND, compiler = HIPCC, flags = _HIPCC_FLAGS, define = "QLINK_GPU_HIP",
                  kernels = _KERNELS, deps = ["@local_hip//:hip_runtime"]),
}

def _exec_objects_impl(ctx):
    return [DefaultInfo(files = depset(ctx.files.srcs))]

# The kernels' objects taken from the exec configuration: their nvcc/hipcc flags are fixed,
# so one build serves every target configuration (the sanitizer runs, -c opt) instead of a
# compile per configuration's output folder.
_exec_objects = rule(
    implementation = _exec_objects_impl,
    attrs = {"srcs": attr.label_list(cfg = "exec", allow_files = [".o"])},
)

def gpu_backend(vendor):
    """cc_library `<vendor>_backend`: the shared host code plus the vendor's kernel objects."""
    v = _VENDORS[vendor]
    if not v.found:
        return
    for kernel, src in v.kernels.items():
        native.genrule(
            name = "%s_%s" % (vendor, kernel),
            srcs = [src] + _HDRS,
            outs = ["%s_%s.o" % (vendor, kernel)],
            # The compiler by absolute path: it finds its sibling tools there. Headers are
            # listed because a genrule has no include scanning.
            cmd = "%s -c -I. %s $(location %s) -o $@" % (v.compiler, " ".join(v.flags), src),
        )
    _exec_objects(name = vendor + "_kernel_objects", srcs = [":%s_%s" % (vendor, k) for k in v.kernels])
    native.cc_library(
        name = vendor + "_backend",
        srcs = ["//backends/gpu:gpu_backend.cc"] + _QUANT_SRCS + [":%s_kernel_objects" % vendor],
        hdrs = _HDRS + _QUANT_HDRS,
        local_defines = [v.define],
        deps = ["//backends:device_backend", "//backends:vendor_library", "//quant:quant_math"] + v.deps,
        alwayslink = True,
    )

def backend_library(name, vendor, deps):
    """The backend .so of `vendor`, where its toolkit was found."""
    if _VENDORS[vendor].found:
        native.cc_binary(
            name = name,
            additional_linker_inputs = ["//backends:backend.lds"],
            linkopts = ["-Wl,--version-script=$(location //backends:backend.lds)"],
            linkshared = True,
            deps = deps,
        )

def if_found(vendor, targets):
    return targets if _VENDORS[vendor].found else []
