"""Stand-in for auto_round.algorithms.block_runner.BlockForwardRunner: the selected samples
concatenated, forwarded on the runner's device in batches, returned on the cache device."""
import torch

from auto_round.compressors.utils import block_forward


class BlockForwardRunner:
    def __init__(self, batch_size=8, device="cpu", cache_device="cpu"):
        self.batch_size, self.device, self.cache_device = batch_size, device, cache_device
        self.block_forward = block_forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, block, inputs, input_others, indices=None, cache_device=None):
        out_device = cache_device if cache_device is not None else self.cache_device
        listed = indices is None
        indices = list(range(len(inputs))) if indices is None else [int(i) for i in indices]
        outputs = []
        for start in range(0, len(indices), self.batch_size):
            batch = torch.cat([inputs[i] for i in indices[start:start + self.batch_size]], dim=0)
            out = self.block_forward(block, batch, dict(input_others), device=self.device).to(out_device)
            outputs += list(torch.split(out, 1)) if listed else [out]
        return outputs if listed else torch.cat(outputs, dim=0)
