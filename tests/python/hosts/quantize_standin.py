"""A user's quantization script against the stand-in GPTQModel, with no qlink line in it:
what `qlink run` must take over unchanged (tests/python/test_wheel.sh). A forward pass of
a layer over calibration batches, then two layer solves: one with GPTQModel's defaults
(qlink's native engine covers it) and one with mse (it does not: GPTQModel's own solve),
each task built as GPTQModel's processor builds them.
Prints a digest of the solves; exits with --exit-code.

    python quantize_standin.py [--exit-code N]
"""
import argparse
import hashlib

import torch

from gptqmodel.looper.forward_executor import ForwardExecutor
from gptqmodel.quantization.config import QuantizeConfig
from gptqmodel.looper import gptq_processor


def solve(config, seed):
    torch.manual_seed(seed)
    layer = torch.nn.Linear(256, 48)
    g = gptq_processor.GPTQ(layer, config)  # as GPTQModel's processor builds its tasks
    g.quantizer.configure(perchannel=True)
    g.add_batch(torch.randn(300, 32) @ torch.randn(32, 256), None)
    return g.quantize()


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--exit-code", type=int, default=0)
    args = a.parse_args()
    layer = torch.nn.Linear(16, 16)
    batches = [[torch.randn(2, 16)] for _ in range(4)]
    outputs = ForwardExecutor().run_parallel(module=layer, layer_inputs=batches,
                                             layer_input_kwargs=[{} for _ in batches], devices=[torch.device("cpu")])
    assert all(torch.equal(o, layer(b[0])) for o, b in zip(outputs, batches))
    digest = hashlib.sha256()
    for config in (QuantizeConfig(group_size=128), QuantizeConfig(group_size=128, mse=2.4)):
        q, scales, zeros, g_idx = solve(config, seed=0)[:4]
        for t in (q, scales, zeros, g_idx):
            digest.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    print("solves digest", digest.hexdigest())
    return args.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
