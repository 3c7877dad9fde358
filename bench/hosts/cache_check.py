"""gptqmodel_run.py --cache-check: whether the calibration cache qlink placed on the GPU, and
the grouped forwards' batches made from it, still hold at the run's end the bytes they were
made from. A write into them after their making (a copy landing late or into the wrong
tensor, a stray kernel) is named by field and batch; issue 40's divergence moved only the
first group's attention input, which reads batch 0's rotary tables first. Each cache's
tensors are taken when it is made: GPTQModel later gives its cache the next layer's inputs."""
import dataclasses

import torch

from qlink.moves import nested_tensors


class CacheCheck:
    """Wraps `input_cache` (qlink's module)'s on_device and grouped, keeping the tensors each
    made and those it made them from (alive till the end); report() compares them."""

    def __init__(self, input_cache):
        self.placed, self.groups = [], []
        on_device, self.grouped = input_cache.on_device, input_cache.grouped

        def placing(ctx, cache, device):
            moved = on_device(ctx, cache, device)
            self.placed.append((_tensors(cache), _tensors(moved)))
            return moved

        def grouping(cache, plan):
            made = self.grouped(cache, plan)
            self.groups.append((_frozen(cache), plan, _tensors(made)))
            return made
        input_cache.on_device, input_cache.grouped = placing, grouping

    def report(self):
        """{"placed": tensors compared, "placed_differing": ["field[batch]", ...], "grouped": ...,
        "grouped_differing": [...]}: each placed tensor against its source, each grouped batch
        against the same plan's batches made again from the placed cache as it was given."""
        found = {"placed": 0, "placed_differing": [], "grouped": 0, "grouped_differing": []}
        for source, moved in self.placed:
            _compare(source, moved, found, "placed")
        for cache, plan, made in self.groups:
            _compare(_tensors(self.grouped(cache, plan)), made, found, "grouped")
        return found


def _tensors(cache):
    """{"field[batch]": the batch's tensors} of a cache as it is now ("field[None]" for a field
    that is not a list of batches)."""
    out = {}
    for field in dataclasses.fields(cache):
        value = getattr(cache, field.name)
        for i, entry in enumerate(value) if isinstance(value, list) else [(None, value)]:
            out["%s[%s]" % (field.name, i)] = nested_tensors(entry)
    return out


def _frozen(cache):
    """A copy of the cache holding the same batches, which no later change to its lists reaches."""
    return dataclasses.replace(cache, **{f.name: list(getattr(cache, f.name)) for f in dataclasses.fields(cache)
                                         if isinstance(getattr(cache, f.name), list)})


def _compare(expected, got, found, what):
    for name, want in expected.items():
        have = got.get(name, [])
        found[what] += len(want)
        if len(have) != len(want) or any(x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x.to(y.device), y)
                                         for x, y in zip(want, have)):
            found[what + "_differing"].append(name)
