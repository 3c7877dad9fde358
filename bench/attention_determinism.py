"""Whether PyTorch's attention gives the same bytes in every process (the twenty-first session's rare divergence of
GPTQModel's loop: once in about 12 four-layer runs, every solve from layer 0's o_proj on differed while q/k/v's
matched; o_proj's inputs are the process's first attention outputs, and PyTorch does not list cuDNN's attention as
deterministic).

Each of --processes fresh processes makes the same seeded causal bf16 q, k, v at the loop's shape (a grouped forward:
16 samples x 2048 tokens, 32 heads of 128), runs scaled_dot_product_attention --calls times on each backend asked for
(sdpa_kernel with that backend alone), and digests every output; --pin-mb has a thread page-lock host memory while
the first calls run, as the layer loop's read-ahead does. Prints JSON: per backend, how many distinct digests the
first calls and the later calls gave over all processes (1 and 1: the same bytes every time).

    python3 bench/attention_determinism.py [--processes 8] [--calls 4] [--backends cudnn,flash,efficient]
        [--pin-mb 512]
"""
import argparse
import collections
import hashlib
import json
import subprocess
import sys
import threading

import torch

_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "math": "MATH"}


def _digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def one_process(args):
    """{backend: [digest of each call's output]} of this process."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, args.seq, args.dim, device="cuda", dtype=torch.bfloat16,
                           generator=generator) for _ in range(3))
    pinning = None
    if args.pin_mb:
        pinning = threading.Thread(target=lambda: torch.empty(args.pin_mb << 20, dtype=torch.uint8, pin_memory=True))
        pinning.start()
    out = {}
    for name in args.backends.split(","):
        with sdpa_kernel([getattr(SDPBackend, _BACKENDS[name])]):
            out[name] = [_digest(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
                         for _ in range(args.calls)]
    if pinning is not None:
        pinning.join()
    return out


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--processes", type=int, default=8)
    a.add_argument("--calls", type=int, default=4)
    a.add_argument("--backends", default="cudnn,flash,efficient")
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--heads", type=int, default=32)
    a.add_argument("--seq", type=int, default=2048)
    a.add_argument("--dim", type=int, default=128)
    a.add_argument("--pin-mb", type=int, default=512)
    a.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = a.parse_args()
    if args.child:
        print(json.dumps(one_process(args)))
        return
    firsts, laters = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for _ in range(args.processes):
        run = subprocess.run([sys.executable, __file__, "--child"] + sys.argv[1:], capture_output=True, text=True,
                             check=True)
        for name, digests in json.loads(run.stdout.splitlines()[-1]).items():
            firsts[name][digests[0]] += 1
            laters[name].update(digests[1:])
    print(json.dumps({name: {"processes": args.processes, "first_call_digests": dict(firsts[name]),
                             "later_call_digests": dict(laters[name])} for name in firsts}, indent=1))


if __name__ == "__main__":
    main()
