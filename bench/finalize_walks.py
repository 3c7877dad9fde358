"""What GPTQModel's per-module finalize costs in walks of the model as the model grows: its
submodule_finalize walks the whole module tree twice (find_modules) and its offload once
more to name the module (get_module_fullname: named_modules to the module), for each of a
layer's modules; qlink's finalize_lookups go down the module's own path instead.

Builds an MoE-shaped module tree (no weights: 1 x 1 linears) of each --layers count and
times, for the last layer's last expert: a named_modules walk to it (the offload's name),
GPTQModel's find_modules where --hosts names its tree (importing gptqmodel needs its
dependencies: the GPU machine's image with the stand-ins, a second path), and qlink's
lookups. Prints JSON: per layer count, the milliseconds of each and the seconds a layer's
--modules finalizes would spend walking.

    python3 bench/finalize_walks.py [--layers 2,48,94] [--experts 128] [--modules 388] [--hosts DIR[:DIR]]
"""
import argparse
import json
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from qlink.integrations.gptqmodel.contract import finalized_entry, leads_to  # noqa: E402


def tree(layers, experts):
    """A decoder's module tree: attention's four linears, a router and `experts` experts of
    three linears a layer (Qwen3-MoE's names)."""
    root = nn.Module()
    root.embed_tokens = nn.Embedding(1, 1)
    root.layers = nn.ModuleList()
    for _ in range(layers):
        layer = nn.Module()
        layer.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(layer.self_attn, name, nn.Linear(1, 1, bias=False))
        layer.mlp = nn.Module()
        layer.mlp.gate = nn.Linear(1, 1, bias=False)
        layer.mlp.experts = nn.ModuleList()
        for _ in range(experts):
            expert = nn.Module()
            for name in ("gate_proj", "up_proj", "down_proj"):
                setattr(expert, name, nn.Linear(1, 1, bias=False))
            layer.mlp.experts.append(expert)
        root.layers.append(layer)
    return root


def timed_ms(fn, repeat):
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--layers", default="2,48,94")
    a.add_argument("--experts", type=int, default=128)
    a.add_argument("--modules", type=int, default=388, help="a layer's finalized modules (Qwen3-30B-A3B: 388)")
    a.add_argument("--hosts", help="the hosts folder tools/pack.sh lays out (and the stand-ins' folder, after a "
                   "colon): GPTQModel's find_modules timed too")
    a.add_argument("--repeat", type=int, default=10)
    args = a.parse_args()
    find_modules = None
    if args.hosts:
        sys.path[:0] = args.hosts.split(":")
        from gptqmodel.utils.model import find_modules
    out = {"experts": args.experts, "modules": args.modules, "layers": {}}
    for layers in (int(n) for n in args.layers.split(",")):
        root = tree(layers, args.experts)
        path = "layers.%d.mlp.experts.%d.down_proj" % (layers - 1, args.experts - 1)
        target = root.get_submodule(path)
        row = {"modules_in_tree": sum(1 for _ in root.modules()),
               "named_modules_ms": timed_ms(lambda: next(n for n, m in root.named_modules() if m is target),
                                            args.repeat),
               "qlink_ms": timed_ms(lambda: (finalized_entry(root, path, (nn.Linear,)),
                                             leads_to(root, path, target)), args.repeat)}
        walks = row["named_modules_ms"]
        if find_modules is not None:
            row["find_modules_ms"] = timed_ms(lambda: find_modules(root), args.repeat)
            walks += 2 * row["find_modules_ms"]
        row["host_walks_per_layer_s"] = walks * args.modules / 1e3
        row["qlink_per_layer_s"] = row["qlink_ms"] * args.modules / 1e3
        out["layers"][layers] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    with torch.no_grad():
        main()
