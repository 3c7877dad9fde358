"""AutoRound's own unwrap (its real WrapperLinear) of a projection's experts one layer at a
time against qlink's stacked unwrap of them (grouped_unwrap.unwrap): every weight, scale, zp
and iters bit for bit, for AutoRound's RTN (iters=0) and for a tuned block's end (random
best parameters, sym and asym), eager and, on a GPU, with its quant-dequant compiled
(torch.compile, AutoRound's default there: each way's first call compiles, so each is timed
twice, the second the figure), and the time each way takes. Prints a line per case and
PASS, or what differs and FAIL.

    python3 check_unwrap.py [--experts 128] [--rows 768] [--columns 2048] [--group-size 128]
        [--scale-dtype float16|float32]
"""
import argparse
import copy
import sys
import time

from common import setup_paths

setup_paths()


def _layers(torch, count, rows, columns, group_size, sym, device, scale_dtype):
    """`count` bf16 linears with AutoRound's W4A16 keys, as its layer config sets them."""
    layers = []
    for i in range(count):
        layer = torch.nn.Linear(columns, rows, bias=False, device=device, dtype=torch.bfloat16)
        layer.bits, layer.group_size, layer.sym, layer.data_type = 4, group_size, sym, "int"
        layer.act_bits, layer.act_group_size, layer.act_sym, layer.act_data_type = 16, None, None, None
        layer.act_dynamic, layer.super_bits, layer.super_group_size = None, None, None
        layer.scale_dtype, layer.global_name = scale_dtype, "model.layers.0.mlp.experts.%d.up_proj" % i
        layers.append(layer)
    return layers


def _params(torch, count, rows, columns, group_size, device):
    group_len = columns if group_size == -1 else group_size
    groups = rows * columns // group_len
    return [{"value": torch.rand(groups, group_len, device=device) - 0.5,
             "min_scale": torch.rand(groups, device=device) * 0.4 + 0.8,
             "max_scale": torch.rand(groups, device=device) * 0.4 + 0.8} for _ in range(count)]


def _timed(torch, fn):
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    return time.perf_counter() - start


def _differences(torch, a, b):
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if not torch.equal(x.weight, y.weight):
            out.append("layer %d: weight" % i)
        for key in ("scale", "zp", "iters"):
            u, v = getattr(x, key, None), getattr(y, key, None)
            same = (torch.is_tensor(v) and torch.equal(u, v) and u.dtype == v.dtype) if torch.is_tensor(u) else u == v
            if not same:
                out.append("layer %d: %s" % (i, key))
    return out


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--experts", type=int, default=128)
    a.add_argument("--rows", type=int, default=768)
    a.add_argument("--columns", type=int, default=2048)
    a.add_argument("--group-size", type=int, default=128)
    a.add_argument("--scale-dtype", default="float16", choices=("float16", "float32"),
                   help="float32 where the CPU's PyTorch cannot clamp float16")
    args = a.parse_args()
    import torch
    from auto_round.wrapper import WrapperLinear
    from qlink.integrations.autoround import grouped_unwrap
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grouped_unwrap.worth_stacking = lambda where: True  # stacked on the CPU too: the check compares
    torch.manual_seed(0)
    failed = False
    cases = [("RTN (iters=0), sym", True, None),
             ("a tuned block's end, sym", True, dict(enable_minmax_tuning=True, enable_norm_bias_tuning=False)),
             ("a tuned block's end, asym", False, dict(enable_minmax_tuning=True, enable_norm_bias_tuning=False))]
    compiled = (False, True) if device.type == "cuda" and hasattr(torch, "compile") else (False,)
    for (label, sym, tuned), compile_ in [(case, c) for c in compiled for case in cases]:
        layers = _layers(torch, args.experts, args.rows, args.columns, args.group_size, sym, device,
                         getattr(torch, args.scale_dtype))
        if tuned is None:
            kwargs = dict(device=device, enable_minmax_tuning=False, enable_norm_bias_tuning=False,
                          enable_round_tuning=False, enable_torch_compile=compile_, disable_opt_rtn=True, iters=0)
            params = [None] * len(layers)
        else:
            kwargs = dict(tuned, enable_torch_compile=compile_, device=device)
            params = _params(torch, len(layers), args.rows, args.columns, args.group_size, device)
        times = {}
        for way in ("one by one", "stacked"):
            for attempt in range(1 + compile_):  # compiled: the second run, the first having compiled
                done = copy.deepcopy(layers)
                if way == "one by one":
                    times[way] = _timed(torch, lambda: [WrapperLinear(layer, **kwargs).unwrapper(p)
                                                        for layer, p in zip(done, params)])
                else:
                    groups = grouped_unwrap.groups([(str(i), m, device) for i, m in enumerate(done)])[0]
                    assert sum(len(group) for group in groups) == len(done), "not every layer stacked"
                    times[way] = _timed(torch, lambda: [grouped_unwrap.unwrap(
                        WrapperLinear, [m for _, m in group], [params[int(n)] for n, _ in group], **kwargs)
                        for group in groups])
            if way == "one by one":
                theirs = done
        differs = _differences(torch, theirs, done)
        failed |= bool(differs)
        print("%s%s: %d layers of %d x %d on %s: AutoRound one by one %.3f s, stacked %.3f s (%.1fx): %s" % (
            label, ", compiled" if compile_ else "", args.experts, args.rows, args.columns, device,
            times["one by one"], times["stacked"], times["one by one"] / times["stacked"],
            "equal" if not differs else "DIFFERS: " + ", ".join(differs[:8])))
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
