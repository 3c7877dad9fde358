"""bench/hosts/cache_check.py (gptqmodel_run.py --cache-check): the calibration cache placed
on the device and the grouped batches made from it are compared at a run's end with what they
were made from; a tensor written after its making is named by field and batch, nothing else."""
import dataclasses
import os
import sys
import types

import torch

from qlink.integrations.gptqmodel import input_cache

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
from cache_check import CacheCheck  # noqa: E402 (bench/hosts)


@dataclasses.dataclass
class Cache:  # GPTQModel's InputCache's fields
    layer_inputs: list
    layer_input_kwargs: list
    position_ids: list
    attention_masks: list


def _cache(batches=4, tokens=4, hidden=8):
    gen = torch.Generator().manual_seed(0)
    cos, sin = torch.randn(1, tokens, 2, generator=gen), torch.randn(1, tokens, 2, generator=gen)
    return Cache([[torch.randn(1, tokens, hidden, generator=gen)] for _ in range(batches)],
                 [{"position_embeddings": (cos.clone(), sin.clone())} for _ in range(batches)], [],
                 [None] * batches)


def _placed_and_grouped():
    """A move that copies (as to a GPU) and qlink's grouping, two batches a group."""
    module = types.SimpleNamespace(
        on_device=lambda ctx, cache, device: dataclasses.replace(cache, **{
            f.name: input_cache.map_nested(getattr(cache, f.name), lambda ts: [t.clone() for t in ts])
            for f in dataclasses.fields(cache)}),
        grouped=input_cache.grouped)
    check = CacheCheck(module)
    placed = module.on_device(None, _cache(), "device")
    plan, reason = input_cache.grouping_plan(placed, group_rows=8)
    assert reason is None and plan["groups"] == [[0, 1], [2, 3]]
    return check, placed, module.grouped(placed, plan)


def test_a_cache_left_as_made_is_reported_whole():
    check, _, _ = _placed_and_grouped()
    found = check.report()
    assert found == {"placed": 12, "placed_differing": [], "grouped": 6, "grouped_differing": []}


def test_a_tensor_written_after_its_making_is_named():
    check, placed, grouped = _placed_and_grouped()
    with torch.inference_mode():  # the grouped batches are inference tensors, as the host's cache
        placed.layer_input_kwargs[2]["position_embeddings"][1][0, 0, 0] += 1  # batch 2's sin, group 1's tables
        grouped.layer_inputs[0][0][1, 0, 0] += 1  # group 0's second sample
    found = check.report()
    assert found["placed_differing"] == ["layer_input_kwargs[2]"]
    assert found["grouped_differing"] == ["layer_inputs[0]"]  # group 1's tables are batch 2's very tensors


def test_the_cache_given_the_next_layers_inputs_is_held_as_it_was_made():
    check, placed, grouped = _placed_and_grouped()
    grouped.layer_inputs = [[torch.zeros(2, 4, 8)], [torch.zeros(2, 4, 8)]]  # GPTQModel's next layer's inputs
    placed.layer_inputs.clear()
    assert check.report() == {"placed": 12, "placed_differing": [], "grouped": 6, "grouped_differing": []}
