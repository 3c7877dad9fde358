"""The Hessian precision table of issue 23: X^T X of 128 x 2048 bf16 tokens with a few
outlier channels at d = 4096 and d = 11008 on one GPU, each way qlink and PyTorch can sum
it, timed (median of 3 after a warm-up, synchronized) and against a float64 X^T X (relative
Frobenius error, largest relative error on the diagonal), and the diagonal's order within
each group of 128 columns, which GPTQModel's act_group_aware sorts by (the share of groups
whose descending order equals float64's, and equals qlink ieee_fp32's over 128 calls: a
near tie flipped by rounding moves GPTQ's columns, and with them its codes):

  qlink ieee_fp32 / tensor, one call          hessian_accumulate over all 262144 rows (tensor
                                              on CUDA: qlink's kernel, each 32 rows' sum
                                              promoted out of the tensor cores into fp32;
                                              2048 rows per launch)
  qlink ieee_fp32 / tensor, 128 calls         one call per 2048-row sample into one partial
  qlink tensor_gemm, 128 calls                the same on the vendor's GemmEx (ABI 1.11)
  qlink HessianAccumulator, 128 adds          what the GPTQModel hooks run (a clone per add)
  torch fp32 (GPTQModel)                      x.float().T @ x.float()
  torch bf16, one mm (fp32 out)               tensor cores, one product of all rows
  torch bf16, R-row mms summed in fp32        the compensation at R = 2048 and 256 rows

    python3 bench/hessian_precision.py --library DIST/libqlink.so [--dims 4096,11008]
        [--variant NAME ...] [--json OUT.json] [--markdown OUT.md]

Each row's JSON has the digest of the Hessian's bytes: two builds' rows with the same digest
summed alike, bit for bit.
"""
import argparse
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
from timing import median_s  # noqa: E402
from qlink.quant import HessianAccumulator  # noqa: E402

SAMPLES, SEQLEN = 128, 2048
GROUP = 128  # GPTQModel's group size, the span act_group_aware sorts within


def activations(d, gen):
    """SAMPLES x SEQLEN bf16 tokens of dimension d, 8 channels 20-100x larger than the rest
    (LLaMA's inputs have such outliers)."""
    x = torch.randn(SAMPLES * SEQLEN, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    channels = torch.randperm(d, device="cuda", generator=gen)[:8]
    x[:, channels] *= torch.linspace(20, 100, 8, device="cuda").to(torch.bfloat16)
    return x


def reference(x, rows=8192):
    """X^T X in float64, a block of rows at a time."""
    h = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device="cuda")
    for r in range(0, x.shape[0], rows):
        block = x[r:r + rows].double()
        h.addmm_(block.T, block)
    return h


def group_orders(h):
    """Each group's columns in descending order of the diagonal, as act_group_aware sorts
    them (ties by column)."""
    return torch.argsort(h.diagonal().reshape(-1, GROUP), dim=1, descending=True, stable=True)


def share_equal(orders, ref):
    return (orders == ref).all(dim=1).double().mean().item()


def qlink_calls(ctx, x, precision, rows):
    def run():
        d = x.shape[1]
        stream = {torch.cuda.current_device(): torch.cuda.current_stream().cuda_stream}
        h = torch.zeros(d, d, device="cuda")
        for r in range(0, x.shape[0], rows):
            ctx.hessian_accumulate([x[r:r + rows]], [h], streams=stream, precision=precision)
        return h
    return run


def variants(ctx, x):
    d = x.shape[1]

    def qlink_call(precision, rows):
        return qlink_calls(ctx, x, precision, rows)

    def accumulator(precision):
        def run():
            acc, h = HessianAccumulator(ctx, precision), None
            for r in range(0, x.shape[0], SEQLEN):
                h = acc.add(x[r:r + SEQLEN], h)
            return h
        return run

    def torch_chunks(rows):
        def run():
            h = torch.zeros(d, d, device="cuda")
            for r in range(0, x.shape[0], rows):
                block = x[r:r + rows]
                h += torch.mm(block.T, block, out_dtype=torch.float32)
            return h
        return run

    def torch_fp32():
        x32 = x.float()
        return x32.T @ x32

    rows = x.shape[0]
    yield "qlink ieee_fp32, one call", qlink_call("ieee_fp32", rows)
    yield "qlink tensor, one call", qlink_call("tensor", rows)
    yield "qlink ieee_fp32, 128 calls", qlink_call("ieee_fp32", SEQLEN)
    yield "qlink tensor, 128 calls", qlink_call("tensor", SEQLEN)
    yield "qlink tensor_gemm, 128 calls", qlink_call("tensor_gemm", SEQLEN)
    yield "qlink HessianAccumulator ieee_fp32, 128 adds", accumulator("ieee_fp32")
    yield "qlink HessianAccumulator tensor, 128 adds", accumulator("tensor")
    yield "qlink HessianAccumulator tensor_gemm, 128 adds", accumulator("tensor_gemm")
    yield "torch fp32 (GPTQModel)", torch_fp32
    yield "torch bf16, one mm (fp32 out)", torch_chunks(rows)
    yield "torch bf16, 2048-row mms summed in fp32", torch_chunks(2048)
    yield "torch bf16, 256-row mms summed in fp32", torch_chunks(256)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--library", required=True)
    a.add_argument("--json")
    a.add_argument("--markdown")
    a.add_argument("--dims", default="4096,11008")
    a.add_argument("--variant", action="append",
                   help="only this variant (its name as in the table, commas and all); repeatable")
    args = a.parse_args()
    names = [name for name, _ in variants(None, torch.empty(0, 0))]
    unknown = sorted(set(args.variant or ()) - set(names))
    if unknown:
        a.error("unknown variant(s) %s; the variants: %s" % (unknown, names))
    wanted = set(args.variant) if args.variant else None
    ctx = qlink.load({"backend": "cuda", "log_level": "warn"}, library=args.library)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, lines = [], ["| variant | d | time (ms) | rel. Frobenius error vs float64 | max rel. error, diagonal "
                       "| group orders = float64 | group orders = ieee_fp32 |", "|---|---|---|---|---|---|---|"]
    for d in (int(v) for v in args.dims.split(",")):
        x = activations(d, gen)
        exact = reference(x)
        norm, diag = torch.linalg.matrix_norm(exact).item(), exact.diagonal()
        exact_orders, ieee_orders = group_orders(exact), group_orders(qlink_calls(ctx, x, "ieee_fp32", SEQLEN)())
        for name, fn in variants(ctx, x):
            if wanted is not None and name not in wanted:
                continue
            try:
                h, seconds = median_s(fn)
            except Exception as error:  # noqa: BLE001  (a variant this PyTorch lacks is reported)
                rows.append({"variant": name, "d": d, "error": "%s: %s" % (type(error).__name__, error)})
                lines.append("| %s | %d | %s | | | | |" % (name, d, rows[-1]["error"][:80]))
                continue
            diff = h.double() - exact
            fro = torch.linalg.matrix_norm(diff).item() / norm
            worst = (diff.diagonal().abs() / diag.abs().clamp_min(1e-30)).max().item()
            orders = group_orders(h)
            as_exact, as_ieee = share_equal(orders, exact_orders), share_equal(orders, ieee_orders)
            rows.append({"variant": name, "d": d, "ms": round(seconds * 1e3, 2), "rel_fro": fro, "max_rel_diag": worst,
                         "orders_as_float64": as_exact, "orders_as_ieee_fp32": as_ieee,
                         "digest": hashlib.sha256(h.cpu().numpy().tobytes()).hexdigest()[:16]})
            lines.append("| %s | %d | %.2f | %.2e | %.2e | %.1f %% | %.1f %% |"
                         % (name, d, seconds * 1e3, fro, worst, 100 * as_exact, 100 * as_ieee))
            del h, diff
            print(lines[-1], flush=True)
        del x, exact
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
