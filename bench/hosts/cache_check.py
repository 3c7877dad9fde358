"""gptqmodel_run.py --cache-check: whether the calibration cache qlink placed on the GPU, and
the grouped forwards' batches made from it, still hold at the run's end the bytes they were
made from. A write into them after their making (a copy landing late or into the wrong
tensor, a stray kernel) is named by field and batch; issue 40's divergence moved only the
first group's attention input, which reads batch 0's rotary tables first."""
import dataclasses

import torch

from qlink.moves import nested_tensors


class CacheCheck:
    """Wraps `input_cache` (qlink's module)'s on_device and grouped, keeping what each made
    and from what (and so keeping them alive); report() compares them."""

    def __init__(self, input_cache):
        self.placed, self.groups = [], []
        on_device, self.grouped = input_cache.on_device, input_cache.grouped

        def placing(ctx, cache, device):
            moved = on_device(ctx, cache, device)
            self.placed.append((cache, moved))
            return moved

        def grouping(cache, plan):
            made = self.grouped(cache, plan)
            self.groups.append((cache, plan, made))
            return made
        input_cache.on_device, input_cache.grouped = placing, grouping

    def report(self):
        """{"placed": tensors compared, "placed_differing": ["field[batch]", ...], "grouped": ...,
        "grouped_differing": [...]}: each placed tensor against its source, each grouped batch
        against the same plan's batches made again from the (placed) cache."""
        found = {"placed": 0, "placed_differing": [], "grouped": 0, "grouped_differing": []}
        for source, moved in self.placed:
            _compare(source, moved, found, "placed")
        for cache, plan, made in self.groups:
            _compare(self.grouped(cache, plan), made, found, "grouped")
        return found


def _compare(expected, got, found, what):
    for field in dataclasses.fields(expected):
        want, have = getattr(expected, field.name), getattr(got, field.name)
        for i, (a, b) in enumerate(zip(want, have)) if isinstance(want, list) else [(None, (want, have))]:
            for x, y in zip(nested_tensors(a), nested_tensors(b)):
                found[what] += 1
                if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x.to(y.device), y):
                    found[what + "_differing"].append("%s[%s]" % (field.name, i))
