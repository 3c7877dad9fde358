"""nvcc without rules_cuda: a genrule per .cu file, and the CUDA backend's targets,
defined only where the toolkit was found."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

# sm_80 (A100), sm_90 (H100/H200) and PTX for later GPUs.
_GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_object(name, src, hdrs = []):
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        # nvcc by absolute path: it finds its sibling tools there. Headers are listed in
        # hdrs because a genrule has no include scanning.
        cmd = "%s -c -O3 -std=c++17 -Xcompiler -fPIC -I. %s $(location %s) -o $@" % (NVCC, " ".join(_GENCODE), src),
    )

def cuda_backend_library(name, deps):
    """The backend .so, where CUDA was found."""
    if CUDA_FOUND:
        native.cc_binary(
            name = name,
            additional_linker_inputs = ["//backends:backend.lds"],
            linkopts = ["-Wl,--version-script=$(location //backends:backend.lds)"],
            linkshared = True,
            deps = deps,
        )

def if_cuda(targets):
    return targets if CUDA_FOUND else []
