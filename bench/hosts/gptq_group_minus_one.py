"""group_size -1 against GPTQModel's own GPTQ.quantize (issue 21, item 1), on one GPU, from a
folder laid out by tools/pack.sh: a linear layer whose dead input columns (no calibration
token reaches them: zero Hessian diagonal) hold each row's extreme. GPTQModel takes each
row's range before zeroing the dead columns, so those extremes set the scales; qlink's
solve, installed strict, must give the same scales and zeros bit for bit and the same
codes. The rewrite issue 21 removed (-1 sent as a group as wide as the row) is run on the
engine beside them, to show the case tells the two apart. Exit status 0 when qlink
matches and the rewrite does not.

    python3 gptq_group_minus_one.py [--rows 1024] [--columns 4096] [--tokens 2048]
"""
import argparse
import sys

from common import setup_paths

setup_paths()

DEAD = (7, 2049)


def layer_and_tokens(rows, columns, tokens, dtype):
    """A linear layer and correlated calibration tokens, the DEAD columns never reached
    and holding each row's largest magnitude (alternating sign by row)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = torch.nn.Linear(columns, rows, bias=False).to(device="cuda", dtype=dtype)
    x = torch.randn(tokens, 64, device="cuda", generator=gen) @ torch.randn(64, columns, device="cuda", generator=gen)
    x += 0.1 * torch.randn(tokens, columns, device="cuda", generator=gen)
    with torch.no_grad():
        extreme = 3 * layer.weight.float().abs().amax(1)
        sign = torch.where(torch.arange(rows, device="cuda") % 2 == 0, 1.0, -1.0)
        for c in DEAD:
            x[:, c] = 0
            layer.weight[:, c] = (sign * extreme).to(dtype)
    return layer, x.to(dtype)


def gptq_task(GPTQ, layer, x, qcfg):
    task = GPTQ(layer, qcfg)
    task.quantizer.configure(perchannel=True)  # as GPTQModel's GPTQ processor does
    task.add_batch(x, None)
    return task


def codes_of(q, scale, zero):
    """The levels behind GPTQModel's dequantized Q (one group per row)."""
    import torch
    return torch.round(q.float() / scale + zero).to(torch.int64)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--rows", type=int, default=1024)
    a.add_argument("--columns", type=int, default=4096)
    a.add_argument("--tokens", type=int, default=2048)
    args = a.parse_args()
    import torch
    import qlink.integrations.gptqmodel as qlink_gptqmodel
    import qlink.quant
    from gptqmodel.quantization.config import QuantizeConfig
    from gptqmodel.looper import gptq_processor
    from gptqmodel.quantization.gptq import GPTQ

    ok = True
    for sym in (True, False):
        qcfg = QuantizeConfig(bits=4, group_size=-1, sym=sym, desc_act=False, act_group_aware=False)
        layer, x = layer_and_tokens(args.rows, args.columns, args.tokens, torch.float16)
        own_q, own_scale, own_zero, own_gidx = gptq_task(GPTQ, layer, x, qcfg).quantize()[:4]
        reference = gptq_task(GPTQ, layer, x, qcfg)
        hessian = reference.finalize_hessian().clone()
        nsamples = reference.nsamples

        ctx = qlink_gptqmodel.install({"backend": "cuda", "log_level": "warn"}, strict=True)
        q, scale, zero, gidx = gptq_task(gptq_processor.GPTQ, layer, x, qcfg).quantize()[:4]  # qlink's task class
        counted = qlink_gptqmodel.counters()["seams"]["quantize"]
        qlink_gptqmodel.uninstall()

        engine = qlink.quant.gptq_quantize(layer.weight.data, hessian.clone(), bits=4, group_size=-1, sym=sym,
                                           damp=qcfg.damp_percent, nsamples=nsamples, ctx=ctx)
        rewrite = qlink.quant.gptq_quantize(layer.weight.data, hessian.clone(), bits=4, group_size=args.columns,
                                            sym=sym, damp=qcfg.damp_percent, nsamples=nsamples, ctx=ctx)
        own_codes = codes_of(own_q, own_scale, own_zero)
        same_codes = int((engine.codes.to(torch.int64) == own_codes).sum())
        checks = {
            "the solve ran through qlink (strict)": counted["qlink"] == 1 and counted["fallback"] == 0,
            "scales equal bit for bit": torch.equal(scale, own_scale),
            "zeros equal bit for bit": torch.equal(zero, own_zero),
            "g_idx equal": torch.equal(gidx.cpu(), own_gidx.cpu()),
            "engine scales equal (direct call)": torch.equal(engine.scales, own_scale.float()),
            "codes equal": same_codes == own_codes.numel(),
            "the old rewrite's scales differ": not torch.equal(rewrite.scales, own_scale.float()),
        }
        print("sym=%s: %d x %d, dead columns %s, %d tokens" % (sym, args.rows, args.columns, list(DEAD), args.tokens))
        print("  codes equal: %d of %d; Q equal: %d of %d; rows whose rewrite scale differs: %d of %d" % (
            same_codes, own_codes.numel(), int((q == own_q).sum()), q.numel(),
            int((rewrite.scales != own_scale.float()).any(1).sum()), args.rows))
        for name, passed in checks.items():
            print("  %-40s %s" % (name, "yes" if passed else "NO"))
            ok &= bool(passed)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
