"""The package's C bridge to torch (libqlink_torch.so) against PyTorch's own answers; it
binds only where PyTorch has the stable C shim (2.3 on), so these skip elsewhere."""
import os

import numpy as np
import pytest
import torch

from qlink import _bridge


@pytest.fixture(scope="module")
def bridge(library):
    _bridge.load(os.path.dirname(library))
    if _bridge.get() is None:
        pytest.skip("the bridge is not bound: this PyTorch has no stable C shim")
    return _bridge.get()


def _mixed():
    base = torch.arange(96, dtype=torch.float32)
    out = [base, base[8:40], base.view(8, 12).t(), torch.empty(0, dtype=torch.int64),
           torch.ones(3, 5, dtype=torch.bfloat16), torch.zeros(7, dtype=torch.bool),
           torch.empty(2, 3, dtype=torch.complex64),
           torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))]
    if torch.cuda.is_available():
        out += [torch.empty(33, dtype=torch.float16, device="cuda:0"),
                torch.empty(4, 4, device="cuda:%d" % (torch.cuda.device_count() - 1))[:, 1]]
    return out


def test_describe_matches_pytorch(bridge):
    tensors = _mixed()
    leaves = np.frombuffer(bridge.describe(tensors), _bridge.LEAF)
    assert len(leaves) == len(tensors)
    for leaf, t in zip(leaves, tensors):
        assert leaf["device"] == t.get_device(), t
        if t.layout != torch.strided:  # the exact path names it: never contiguous here
            assert leaf["flags"] == 0
            continue
        assert bool(leaf["flags"] & _bridge.CONTIGUOUS) == t.is_contiguous(), t
        assert leaf["data"] == t.data_ptr() and leaf["nbytes"] == t.nbytes, t


def test_describe_refuses_what_is_not_a_tensor(bridge):
    with pytest.raises(TypeError):
        bridge.describe([torch.empty(2), "weights"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_move_leaves_to_the_caller_what_it_cannot_move(bridge, ctx):
    base = torch.randn(64, device="cuda:0")
    leaves = [torch.randn(8, device="cuda:0"), torch.randn(8, device="cuda:1"), torch.randn(8),
              base[:40], base[32:], torch.randn(8, 4, device="cuda:0").t(), torch.empty(0, device="cuda:0")]
    status, moved = bridge.move(*ctx.bridge_plugin(), leaves, 1)
    assert status == 0
    assert moved[1] is leaves[1]  # already there
    assert moved[2:] == [None] * 5  # host, two overlapping views, not contiguous, empty
    assert moved[0].device == torch.device("cuda:1") and torch.equal(moved[0].cpu(), leaves[0].cpu())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_calls_release_every_handle(bridge, ctx):
    torch.cuda.synchronize()
    before = [torch.cuda.memory_allocated(d) for d in (0, 1)]
    x = torch.randn(1 << 20, device="cuda:0")
    y = torch.empty_like(x, device="cuda:1")
    for _ in range(3):
        bridge.describe([x, x, y])
        assert bridge.copy(*ctx.bridge_plugin(), [x], [y]) == 0
        del bridge.move(*ctx.bridge_plugin(), [x], 1)[1][0]
        assert bridge.copy(*ctx.bridge_plugin(), [x, x], [y, y]) != 0  # overlap
    del x, y
    torch.cuda.synchronize()
    assert [torch.cuda.memory_allocated(d) for d in (0, 1)] == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_streams_are_read_where_cuda_is(bridge):
    assert bridge.has_streams()
