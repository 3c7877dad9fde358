"""Finds the CUDA toolkit at /usr/local/cuda (not an apt package on Debian 12).

Without it, @local_cuda still exists with CUDA_FOUND = False, and the CUDA backend is
simply not built: everything else builds and tests the same."""

_CUDA = "/usr/local/cuda"

def _cuda_configure_impl(rctx):
    found = rctx.path(_CUDA + "/bin/nvcc").exists and rctx.path(_CUDA + "/lib64/libcudart_static.a").exists
    if found:
        rctx.symlink(_CUDA + "/include", "include")
        rctx.symlink(_CUDA + "/lib64", "lib64")
        rctx.symlink(Label("//third_party:cuda.BUILD"), "BUILD")
    else:
        rctx.file("BUILD", "")
    rctx.file("defs.bzl", "CUDA_FOUND = %s\nNVCC = \"%s/bin/nvcc\"\n" % (found, _CUDA))

cuda_configure = repository_rule(implementation = _cuda_configure_impl, local = True)
