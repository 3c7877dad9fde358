"""Whether the native engine's GPTQ solve gives GPTQModel's own bytes: GPTQ.quantize and the
engine on the same bf16 weight and fp32 Hessian (4-bit g128 sym in GPTQModel's group-aware
order, its inverse, IEEE fp32 updates), at the shapes of a Qwen3-30B-A3B layer's linears,
each Hessian as made and again with two entries of one group of its diagonal made equal.
Which shapes part, and whether a tie does (GPTQModel's order takes torch.topk on the GPU) or
a damp scale PyTorch's fp32 mean rounds otherwise than the engine's exact one (mean_off).
First, by shape, whether the cross-block update made as GPTQModel makes it and as the engine
does (cublasSgemm on a handle of its own, into W) give the same bits on this GPU, and which
of the engine call's settings parts them.

    python3 bench/solve_bits.py --library DIST/libqlink.so --gptqmodel DIRS [--seeds 8] [--out FILE.json]
"""
import argparse
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts"))
import qlink  # noqa: E402
from digests import gar_order, hessian_traits  # noqa: E402
from gptq_bench import codes_of, gptqmodel_solver, hessian_of  # noqa: E402
from qlink.quant import gptq_quantize  # noqa: E402

SHAPES = (("q_proj", 4096, 2048), ("k_proj", 512, 2048), ("o_proj", 2048, 4096), ("expert gate/up", 768, 2048),
          ("expert down", 2048, 768))
GROUP, SAMPLES = 128, 16384


def tied(h, gen):
    """A copy of h whose diagonal holds one more equal pair: two columns of one group (GAR's
    groups are consecutive columns) both given the larger of their entries, which keeps h
    positive definite. Returns (copy, (i, j))."""
    groups = h.shape[0] // GROUP
    g = int(torch.randint(groups, (1,), generator=gen))
    i, j = (g * GROUP + int(c) for c in torch.randperm(GROUP, generator=gen)[:2])
    out = h.clone()
    out[i, i] = out[j, j] = torch.maximum(h[i, i], h[j, j])
    return out, (i, j)


class EngineBlas:
    """The libcublas PyTorch loaded, called through ctypes as the engine calls it: a handle
    of its own on PyTorch's stream, `workspace` bytes set as its workspace (None: cuBLAS's
    default), row-major C = alpha A B + beta C as column-major cublasSgemm with the operands
    swapped (quant/gpu/gpu_quant_math.cc's Gemm). workspace "pytorch": PyTorch's own handle
    (torch.cuda.current_blas_handle(), its settings as PyTorch made them)."""

    def __init__(self, workspace):
        self.path = next((path for path in cublas_files() if "/libcublas.so" in path), None)
        if self.path is None:
            raise RuntimeError("no libcublas mapped in this process after PyTorch's first matmul")
        self.lib = ctypes.CDLL(self.path)
        if workspace == "pytorch":
            self.handle = ctypes.c_void_p(torch.cuda.current_blas_handle())
            return
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream_v2")
        if workspace is not None:
            self.work = torch.empty(workspace, dtype=torch.uint8, device="cuda")
            self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.work.data_ptr()),
                                                       ctypes.c_size_t(workspace)), "cublasSetWorkspace_v2")

    @staticmethod
    def _check(status, call):
        if status != 0:
            raise RuntimeError("%s returned cuBLAS status %d" % (call, status))

    def settings(self):
        """The handle's math mode, atomics mode and SM count target, as cuBLAS reports them."""
        out = {}
        for name, call in (("math", "cublasGetMathMode"), ("atomics", "cublasGetAtomicsMode"),
                           ("sm_count_target", "cublasGetSmCountTarget")):
            value, get = ctypes.c_int(), getattr(self.lib, call, None)
            status = get(self.handle, ctypes.byref(value)) if get is not None else None
            out[name] = value.value if status == 0 else "no %s" % call if status is None else "status %d" % status
        return out

    def gemm(self, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """Pointers as ints (bytes), row-major leading dimensions in elements."""
        f, p = ctypes.c_float, ctypes.c_void_p
        self._check(self.lib.cublasSgemm_v2(self.handle, 0, 0, n, m, k, ctypes.byref(f(alpha)), p(b), ldb, p(a), lda,
                                            ctypes.byref(f(beta)), p(c), ldc), "cublasSgemm_v2")


def cublas_files():
    """The cuBLAS and cuBLASLt files mapped in this process, sorted."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/libcublas" in line})


def block_update_ways(rows, cols, gen, blas):
    """Of a solve's cross-block updates W[:, i2:] -= E @ U[i1:i2, i2:] (E rows x 128, fp32),
    how many give other bits than GPTQModel's way (PyTorch's product in a new matrix, then
    subtracted), made each of the ways in WAYS; and how many updates there are."""
    u = torch.linalg.cholesky(hessian_of(cols, gen, SAMPLES).double()).float().t().contiguous()
    blocks = range(0, cols - GROUP, GROUP)
    apart = {way: 0 for way in WAYS}
    for i1 in blocks:
        i2 = i1 + GROUP
        w = torch.randn(rows, cols, device="cuda", generator=gen)
        e = torch.randn(rows, GROUP, device="cuda", generator=gen) * 1e-3
        theirs = w[:, i2:] - e.matmul(u[i1:i2, i2:])
        for way in WAYS:
            apart[way] += not torch.equal(theirs, updated(w, e, u, i1, *way, blas))
    return apart, len(blocks)


def updated(w, e, u, i1, caller, form, blas):
    """W[:, i2:] - E @ U[i1:i2, i2:] (a new tensor) made by `caller`, one of blas' handles
    (the engine's call through ctypes) or PyTorch, in `form`."""
    rows, cols, i2 = w.shape[0], w.shape[1], i1 + GROUP
    n = cols - i2
    if caller not in blas:
        if form == INTO_W:
            mine = w.clone()
            mine[:, i2:].addmm_(e, u[i1:i2, i2:], beta=1, alpha=-1)
            return mine[:, i2:]
        backend = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt" if caller == "PyTorch on cuBLASLt" else backend)
        try:
            return w[:, i2:] - e.matmul(u[i1:i2, i2:])
        finally:
            torch.backends.cuda.preferred_blas_library(backend)
    u_at = u.data_ptr() + 4 * (i1 * cols + i2)
    if form == PRODUCT:
        product = torch.empty(rows, n, device=w.device)
        blas[caller].gemm(rows, n, GROUP, 1.0, e.data_ptr(), GROUP, u_at, cols, 0.0, product.data_ptr(), n)
        return w[:, i2:] - product
    mine = w.clone()
    blas[caller].gemm(rows, n, GROUP, -1.0, e.data_ptr(), GROUP, u_at, cols, 1.0, mine.data_ptr() + 4 * i2, cols)
    return mine[:, i2:]


# (caller, form): the engine's call first (its handle has a 32 MiB workspace), then what could
# part it from PyTorch's: the workspace, the product made whole, the handle, PyTorch's BLAS
# backend.
INTO_W, PRODUCT = "one GEMM into W (beta 1)", "product then subtract"
WAYS = (("32 MiB workspace", INTO_W), ("32 MiB workspace", PRODUCT), ("default workspace", INTO_W),
        ("default workspace", PRODUCT), ("PyTorch's handle", PRODUCT), ("PyTorch", INTO_W),
        ("PyTorch on cuBLASLt", PRODUCT))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", required=True)
    ap.add_argument("--gptqmodel", required=True, help="folders holding the gptqmodel package and its stand-ins")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--out")
    a = ap.parse_args()
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library)
    solve_gm, why = gptqmodel_solver(a.gptqmodel)
    if solve_gm is None:
        sys.exit("GPTQModel unavailable: %s" % why)
    torch.ones(8, 8, device="cuda").matmul(torch.ones(8, 8, device="cuda"))  # PyTorch loads its cuBLAS
    blas = {"32 MiB workspace": EngineBlas(32 << 20), "default workspace": EngineBlas(None),
            "PyTorch's handle": EngineBlas("pytorch")}
    backend = torch.backends.cuda.preferred_blas_library()
    print("cuBLAS %s; PyTorch's BLAS backend %s" % (blas["default workspace"].path, backend))
    settings = {name: handle.settings() for name, handle in blas.items()}
    for name, values in settings.items():
        print("%s: %s" % (name, values))
    print("| linear | rows x columns | way | cross-block updates whose bits part from GPTQModel's way |")
    print("|---|---|---|---|")
    updates = []
    for name, rows, cols in SHAPES:
        apart, total = block_update_ways(rows, cols, torch.Generator(device="cuda").manual_seed(0), blas)
        for way in WAYS:
            label = "%s, %s" % way
            updates.append({"linear": name, "rows": rows, "columns": cols, "way": label, "apart": apart[way],
                            "updates": total})
            print("| %s | %d x %d | %s | %d of %d |" % (name, rows, cols, label, apart[way], total), flush=True)
    rows_out = []
    print("| linear | rows x columns | seed | diagonal | mean_off | output bytes equal | codes equal | "
          "loss qlink / GPTQModel |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows, cols in SHAPES:
        for seed in range(a.seeds):
            gen = torch.Generator(device="cuda").manual_seed(seed)
            cpu_gen = torch.Generator().manual_seed(seed)
            h = hessian_of(cols, gen, SAMPLES)
            w = (torch.randn(rows, cols, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
            for diagonal, hessian in (("as made", h), ("one tie", tied(h, cpu_gen)[0])):
                ours = gptq_quantize(w, hessian, bits=4, group_size=GROUP, sym=True, act_group_aware=True,
                                     nsamples=SAMPLES, inverse="cholesky_inverse", tf32=False, ctx=ctx)
                gq, gs, gz, gg, gloss, _ = solve_gm(w, hessian, False, True, SAMPLES)
                row = {"linear": name, "rows": rows, "columns": cols, "seed": seed, "diagonal": diagonal,
                       "mean_off": int(hessian_traits(hessian, GROUP, gar_order(hessian, GROUP))["mean_off"]),
                       "bytes_equal": 100 * (ours.weight.cpu().view(torch.int16) ==
                                             gq.cpu().view(torch.int16)).float().mean().item(),
                       "codes_equal": 100 * (ours.codes.cpu() == codes_of(gq, gs, gz, gg).cpu()).float().mean().item(),
                       "loss_ratio": ours.loss / gloss}
                rows_out.append(row)
                print("| %(linear)s | %(rows)d x %(columns)d | %(seed)d | %(diagonal)s | %(mean_off)d | "
                      "%(bytes_equal).4f %% | "
                      "%(codes_equal).4f %% | %(loss_ratio).7f |" % row, flush=True)
    print("cuBLAS files mapped after the engine's solves: %s" % " ".join(cublas_files()))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "blas_backend": backend,
                       "handles": settings, "updates": updates,
                       "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
