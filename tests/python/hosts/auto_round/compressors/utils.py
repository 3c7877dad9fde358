"""Stand-in for auto_round.compressors.utils: the calibration sampler, the best-parameter
snapshot and the block forward."""
import random


class IndexSampler:
    """Shuffled batches of sample indices, reshuffled when fewer than a batch remain;
    every batch drawn is also appended to IndexSampler.drawn (the tests' record)."""
    drawn = []

    def __init__(self, nsamples, batch_size):
        if batch_size <= 0 or batch_size > nsamples:
            raise ValueError("batch_size must be > 0 and <= nsamples")
        self.nsamples, self.batch_size, self.index = nsamples, batch_size, 0
        self.indices = list(range(nsamples))
        random.shuffle(self.indices)

    def next_batch(self):
        if self.index + self.batch_size > self.nsamples:
            random.shuffle(self.indices)
            self.index = 0
        batch = self.indices[self.index:self.index + self.batch_size]
        self.index += self.batch_size
        IndexSampler.drawn.append(batch)
        return batch


def collect_best_params(block, cache_device="cpu"):
    return {n: {k: p.data.to(cache_device, copy=True) for k, p in m.params.items()}
            for n, m in block.named_modules() if hasattr(m, "orig_layer")}


def block_forward(block, input_ids, input_others, amp=False, amp_dtype=None, device="cpu", output_return_id=0):
    input_ids = input_ids.to(device)
    others = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in input_others.items()}
    return block(input_ids, **others)
