"""GPTQ as GPTQModel's GPTQ.quantize and Quantizer run it, column by column in PyTorch: the
reference the native engine is compared with (in CI on the CPU, on the GPU machine on
CUDA). The damp's mean is summed in double, as the engine does."""
import contextlib
import ctypes
import os

import torch


def find_params(x, maxq, sym):
    zero_row = torch.zeros(x.shape[0], device=x.device)
    xmin = torch.minimum(x.min(1).values, zero_row)
    xmax = torch.maximum(x.max(1).values, zero_row)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    flat = (xmin == 0) & (xmax == 0)
    xmin[flat], xmax[flat] = -1, 1
    # maxq as a tensor on x's device, as GPTQModel's Quantizer keeps it: PyTorch's CUDA
    # division by a Python number multiplies by its reciprocal, which rounds differently.
    scale = (xmax - xmin) / torch.tensor(maxq, dtype=x.dtype, device=x.device)
    zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-xmin / scale)
    return scale.unsqueeze(1), zero.unsqueeze(1)


def quantize(x, scale, zero, maxq):
    levels = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (levels - zero), levels


def ill_conditioned_problem(rows=96, cols=384, seed=0, device="cuda"):
    """(weight, Hessian): a random weight and the fp32 Hessian of activations of rank cols/8
    plus a little noise (condition number in the thousands, as real layers' are)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = max(512, 2 * cols)
    x = torch.randn(tokens, cols // 8, generator=gen, device=device) @ torch.randn(cols // 8, cols, generator=gen,
                                                                                   device=device)
    x = (x + 0.3 * torch.randn(tokens, cols, generator=gen, device=device)).double()
    return 0.02 * torch.randn(rows, cols, generator=gen, device=device), ((x.t() @ x) * (2.0 / tokens)).float()


def inverse_factor(hd, inverse="cholesky_inverse"):
    """U (H^-1 = U^T U, upper) of the damped Hessian hd: GPTQModel's chain (cholesky,
    cholesky_inverse, cholesky upper), or the engine's "triangular" route (the Cholesky factor
    of hd in reverse column order, inverted by a triangular solve, reversed back)."""
    if inverse == "triangular":
        lower = torch.linalg.cholesky(hd.flip(0, 1))
        eye = torch.eye(hd.shape[0], dtype=hd.dtype, device=hd.device)
        return torch.linalg.solve_triangular(lower, eye, upper=False).flip(0, 1)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hd)), upper=True)


def reference_gptq(weight, hessian, bits=4, group_size=128, sym=True, desc_act=False, static_groups=False,
                   damp=0.01, damp_auto_increment=0.01, block=128, act_group_aware=False, inverse="cholesky_inverse"):
    """(codes, scales, zeros, g_idx, dequantized, loss sum, damp), in the Hessian's dtype (fp32
    as GPTQModel runs it; float64 for the truth a rounding is judged by); inverse: the route
    to U (inverse_factor)."""
    maxq = 2 ** bits - 1
    W = weight.to(hessian.dtype).clone()
    H = hessian.clone()
    cols = W.shape[1]
    gs = cols if group_size == -1 else group_size
    scale, zero = find_params(W, maxq, sym)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    statics = [find_params(W[:, g:g + gs], maxq, sym) for g in range(0, cols, gs)] if static_groups else []
    perm = None
    if desc_act:
        perm = torch.argsort(torch.diag(H), descending=True, stable=True)
    elif act_group_aware:  # GPTQModel's gar.py: columns within each group, then the groups
        values, local = torch.sort(torch.diag(H).reshape(-1, gs), dim=1, descending=True, stable=True)
        group_order = torch.argsort(values[:, 0], descending=True, stable=True)
        perm = (local + torch.arange(len(local), device=H.device).unsqueeze(1) * gs)[group_order].reshape(-1)
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]
        invperm = torch.argsort(perm)
    mean = torch.diag(H).double().mean().to(H.dtype)
    while 0 < damp < 1:
        Hd = H.clone()
        Hd.diagonal().add_(torch.tensor(damp, dtype=H.dtype) * mean)
        try:
            Hinv = inverse_factor(Hd, inverse)
            break
        except RuntimeError:
            if damp_auto_increment <= 0:
                raise
            damp += damp_auto_increment
    Q, levels, losses = torch.zeros_like(W), torch.zeros_like(W), torch.zeros_like(W)
    scales, zeros, now_idx = [], [], 1
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        W1, Err1 = W[:, i1:i2].clone(), torch.zeros_like(W[:, i1:i2])
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            w, d = W1[:, i], Hinv1[i, i]
            if group_size != -1:
                if not static_groups:
                    if (i1 + i) % gs == 0:
                        scale, zero = find_params(W[:, i1 + i:i1 + i + gs], maxq, sym)
                    if (i1 + i) // gs - now_idx == -1:
                        scales.append(scale)
                        zeros.append(zero)
                        now_idx += 1
                else:
                    idx = perm[i1 + i].item() if desc_act else i1 + i
                    scale, zero = statics[idx // gs]
            q, lv = quantize(w.unsqueeze(1), scale, zero, maxq)
            q = q.flatten()
            Q[:, i1 + i], levels[:, i1 + i] = q, lv.flatten()
            losses[:, i1 + i] = (w - q) ** 2 / d ** 2 / 2
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    g_idx = torch.tensor([(perm[i].item() if static_groups and desc_act else i) // gs for i in range(cols)],
                         dtype=torch.int32, device=W.device)
    if perm is not None:
        Q, levels = Q[:, invperm], levels[:, invperm]
    if desc_act:
        g_idx = g_idx[invperm]
    if act_group_aware:  # the groups' ranges back in the groups' own order
        scales = [scales[k] for k in torch.argsort(group_order).tolist()]
        zeros = [zeros[k] for k in torch.argsort(group_order).tolist()]
    if static_groups:
        scales, zeros = [s for s, _ in statics], [z for _, z in statics]
    if not scales:
        scales, zeros = [scale], [zero]
    return (levels.to(torch.uint8), torch.cat(scales, 1), torch.cat(zeros, 1), g_idx, Q, losses.double().sum().item(),
            damp)


def torch_linalg_files():
    """(BLAS file, LAPACK file) this process's PyTorch runs on, or None where PyTorch carries
    its BLAS inside itself (pip's wheels link MKL statically): the engine pointed at the same
    files runs the same kernels as the reference, so the two can be compared bit for bit."""
    torch.ones(2, 2) @ torch.ones(2, 2)  # the libraries are loaded with torch itself; this makes sure
    mapped = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                mapped.add(fields[5])
    named = lambda prefix: sorted(f for f in mapped if os.path.basename(f).startswith(prefix))  # noqa: E731
    blas, lapack = named("libblas.so"), named("liblapack.so")
    return (blas[0], lapack[0]) if len(blas) == 1 and len(lapack) == 1 else None


@contextlib.contextmanager
def serial_blas(blas_file):
    """The BLAS library at blas_file on one thread inside, where it has a thread setting
    (OpenBLAS): the CPU engine runs it so, and a product blocks by its thread count."""
    try:
        lib = ctypes.CDLL(blas_file)
        get, set_threads = lib.openblas_get_num_threads, lib.openblas_set_num_threads
    except (OSError, AttributeError):  # not loadable here, or not OpenBLAS: one blocking
        yield
        return
    before = get()
    set_threads(1)
    try:
        yield
    finally:
        set_threads(before)
