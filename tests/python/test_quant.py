"""The data-parallel engines on the CPU backend's virtual devices (worlds 1 to 8):
Hessians merged in device order, GPTQ with rows split over replicas, SignRound with
sign-cast gradients, each against the serial engine."""
import pytest
import torch

import qlink
from qlink.quant import (Placement, gptq_quantize, hessian, parallel_devices, parallel_gptq, parallel_hessian,
                         shard_sizes, sign_round)

WORLDS = [1, 2, 3, 4, 8]


@pytest.fixture(scope="module")
def cpu8(library):
    with qlink.load({"backend": "cpu", "cpu_devices": 8, "log_level": "off"}, library=library) as ctx:
        yield ctx


def test_shards_are_contiguous_with_the_remainder_first():
    assert shard_sizes(129, 4) == [33, 32, 32, 32]
    assert shard_sizes(8, 8) == [1] * 8
    assert sum(shard_sizes(1000, 7)) == 1000


@pytest.mark.parametrize("world", WORLDS)
def test_merged_hessian_matches_serial(cpu8, world):
    gen = torch.Generator().manual_seed(world)
    x = torch.randn(129, 96, generator=gen)
    place = Placement(range(world), ctx=cpu8)
    shards = list(torch.split(x, shard_sizes(129, world)))
    h = parallel_hessian(shards, place)
    serial = hessian(x) * (2.0 / 129)
    assert torch.allclose(h, serial, atol=5e-7, rtol=5e-7)
    assert torch.equal(h, parallel_hessian(shards, place))  # device order: the same bits every time


def test_gptq_beats_round_to_nearest(cpu8):
    gen = torch.Generator().manual_seed(0)
    # Correlated inputs (what a model's activations are): GPTQ's error feedback pays off.
    x = torch.randn(512, 32, generator=gen) @ torch.randn(32, 256, generator=gen) + 0.1 * torch.randn(512, 256, generator=gen)
    w = torch.randn(64, 256, generator=gen)
    h = hessian(x) * (2.0 / 512)
    q = gptq_quantize(w, h, bits=4, group_size=128)
    rtn = gptq_quantize(w, torch.eye(256), bits=4, group_size=128, damp=0.0)  # identity H: plain rounding
    err = lambda wq: ((x @ (wq - w).t()) ** 2).mean()  # noqa: E731
    assert err(q.weight) < 0.5 * err(rtn.weight)
    # Every weight sits on its group's 16-level grid.
    levels = q.weight / q.scales.repeat_interleave(128, 1) + q.zeros.repeat_interleave(128, 1)
    assert torch.allclose(levels, levels.round(), atol=1e-3) and levels.min() > -1e-3 and levels.max() < 15 + 1e-3


@pytest.mark.parametrize("world", WORLDS)
def test_parallel_gptq_matches_serial(cpu8, world):
    gen = torch.Generator().manual_seed(10 + world)
    x = torch.randn(300, 256, generator=gen)
    w = torch.randn(37, 256, generator=gen)
    h = hessian(x) * (2.0 / 300)
    serial = gptq_quantize(w, h)
    dp = parallel_gptq(w, h, Placement(range(world), ctx=cpu8))
    # Rows are independent given H, but BLAS may round a matmul over a subset of rows
    # differently, and GPTQ's error feedback carries one flipped level along its row: the
    # same grid, every weight on it, and the layer's output error of serial GPTQ.
    assert torch.allclose(dp.scales, serial.scales, rtol=1e-5, atol=1e-7)
    levels = dp.weight / dp.scales.repeat_interleave(128, 1) + dp.zeros.repeat_interleave(128, 1)
    assert torch.allclose(levels, levels.round(), atol=1e-3)
    err = lambda wq: ((x @ (wq - w).t()) ** 2).mean()  # noqa: E731
    assert abs(err(dp.weight) / err(serial.weight) - 1) < 0.02
    assert (dp.weight == serial.weight).float().mean() > 0.9


class Mlp(torch.nn.Module):
    def __init__(self, dim=128, hidden=256):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_sign_round_with_sharded_rows_matches_serial(cpu8, world):
    torch.manual_seed(0)
    block = Mlp()
    inputs = torch.randn(16, 4, 128)
    rtn = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=0)
    serial = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=30, batch_size=8)
    dp = sign_round(block, inputs, Placement(range(world), ctx=cpu8), iters=30, batch_size=8)
    assert serial.loss < rtn.loss
    assert dp.loss < rtn.loss
    assert abs(dp.loss - serial.loss) <= 0.05 * serial.loss
    for name, w in serial.weights.items():
        agree = (dp.weights[name] == w).float().mean().item()
        assert agree > 0.99, (name, agree)
    again = sign_round(block, inputs, Placement(range(world), ctx=cpu8), iters=30, batch_size=8)
    assert all(torch.equal(again.weights[name], w) for name, w in dp.weights.items())  # gradients summed in device order


def test_sign_round_with_fewer_rows_than_replicas(cpu8):
    torch.manual_seed(2)
    block = torch.nn.Linear(128, 3)  # 3 rows over 8 replicas: five own none
    inputs = torch.randn(16, 128)
    serial = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=10, batch_size=8)
    dp = sign_round(block, inputs, Placement(range(8), ctx=cpu8), iters=10, batch_size=8)
    assert abs(dp.loss - serial.loss) <= 0.05 * serial.loss


def test_parallel_devices_follow_autoround(cpu8):
    devs = [3, 0, 1, 2, 4]
    assert parallel_devices("off", devs, iters=200, batch_size=8, home=3) == [3]
    assert parallel_devices("auto", devs, iters=200, batch_size=8, home=3) == [3, 0, 1, 2]  # power of two
    assert parallel_devices("auto", devs, iters=0, batch_size=8, home=3) == [3, 0, 1, 2, 4]  # all at iters=0
    assert parallel_devices("auto", devs, iters=200, batch_size=3, home=3) == [3, 0]  # batch demotes
    assert parallel_devices(2, devs, iters=200, batch_size=8) == [3, 0]
    gpus = ["cuda:10", "cuda:2", "cuda:0"]
    assert parallel_devices("auto", gpus, iters=0, batch_size=8, home="cuda:0") == ["cuda:0", "cuda:2", "cuda:10"]
    with pytest.raises(ValueError) as refused:
        parallel_devices(6, devs, iters=200, batch_size=8)
    assert "6 replicas asked, 5 devices visible" in str(refused.value)
    assert "power-of-two world" in str(refused.value)
    with pytest.raises(ValueError, match="at least 2 replicas, got 1"):
        parallel_devices(1, devs, iters=0, batch_size=8)
    with pytest.raises(ValueError, match="must be 'off', 'auto' or an int"):
        parallel_devices("on", devs, iters=0, batch_size=8)


def test_sign_round_demotes_a_world_larger_than_the_batch(cpu8):
    torch.manual_seed(1)
    block, inputs = Mlp(), torch.randn(8, 128)
    serial = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=5, batch_size=2)
    demoted = sign_round(block, inputs, Placement(range(4), ctx=cpu8), iters=5, batch_size=2)  # runs at world 2
    assert abs(demoted.loss - serial.loss) <= 0.05 * serial.loss


def test_sign_round_refuses_what_cannot_engage(cpu8):
    with pytest.raises(ValueError, match="in_features 100 is not a multiple of group_size 128"):
        sign_round(torch.nn.Linear(100, 8), torch.randn(8, 100), Placement([0], ctx=cpu8), iters=1)
    with pytest.raises(ValueError, match="each replica needs its own device"):
        Placement([0, 0], ctx=cpu8)
