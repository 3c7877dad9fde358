"""Stand-in for auto_round.algorithms.block_runner.BlockForwardRunner: the selected samples
concatenated (select_batch: per-sample tensors of input_others selected alike, shared ones
kept), forwarded on the runner's device in batches, returned on the cache device."""
import torch

from auto_round.compressors.utils import block_forward


class BlockForwardRunner:
    def __init__(self, batch_size=8, device="cpu", cache_device="cpu", shared_cache_keys=()):
        self.batch_size, self.device, self.cache_device = batch_size, device, cache_device
        self.batch_dim, self.shared_cache_keys = 0, shared_cache_keys
        self.block_forward = block_forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, block, inputs, input_others, indices=None, cache_device=None):
        out_device = cache_device if cache_device is not None else self.cache_device
        listed = indices is None
        indices = torch.arange(len(inputs)) if indices is None else torch.as_tensor(indices, dtype=torch.long)
        outputs = []
        for start in range(0, len(indices), self.batch_size):
            batch, others = self.select_batch(inputs, input_others, indices[start:start + self.batch_size])
            out = self._normalize_output(self._forward_one_batch(block, batch, others), block).to(out_device)
            outputs += list(torch.split(out, 1)) if listed else [out]
        return outputs if listed else torch.cat(outputs, dim=0)

    def select_batch(self, inputs, input_others, indices):
        if isinstance(inputs, list):
            selected = torch.cat([inputs[i] for i in indices], dim=self.batch_dim)
        else:
            selected = torch.index_select(inputs, self.batch_dim, indices)
        others = {}
        for key, value in input_others.items():
            if key in self.shared_cache_keys or not isinstance(value, (list, torch.Tensor)) or (
                    isinstance(value, torch.Tensor) and value.dim() == 0):
                others[key] = value
            elif isinstance(value, list):  # one per sample
                chosen = [value[i] for i in indices]
                others[key] = chosen[0] if len(chosen) == 1 else torch.cat(chosen, dim=self.batch_dim)
            else:
                others[key] = torch.index_select(value, self.batch_dim, indices)
        return selected, others

    def _forward_one_batch(self, block, batch_inputs, batch_others):
        return self.block_forward(block, batch_inputs, dict(batch_others), device=self.device)

    def _normalize_output(self, output, block=None):
        return output[0] if isinstance(output, (tuple, list)) else output
