"""Copies through the plugin on the CPU backend's virtual devices, torch tensors as DLPack."""
import os
import threading
import time

import pytest
import torch

import qlink

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool, torch.complex64]


def _random(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=gen).to(dtype)


def test_batch_of_every_dtype_is_byte_exact(cpu4):
    gen = torch.Generator().manual_seed(0)
    sources = [_random((3, 5 + i), dt, gen) for i, dt in enumerate(DTYPES)]
    targets = [torch.zeros_like(t) for t in sources]
    cpu4.copy(sources, targets, source_devices=[i % 4 for i in range(len(sources))],
              target_devices=[(i + 1) % 4 for i in range(len(sources))])
    for s, t in zip(sources, targets):
        assert torch.equal(s.view(torch.uint8) if s.dtype != torch.bool else s, t.view(torch.uint8)
                           if t.dtype != torch.bool else t)


def test_odd_sizes_and_offsets_into_a_larger_allocation(cpu4):
    base = torch.arange(1000, dtype=torch.uint8)
    out = torch.zeros(1000, dtype=torch.uint8)
    pairs = [(1, 3), (17, 40), (333, 500)]  # (size, offset)
    cpu4.copy([base[o:o + n] for n, o in pairs], [out[o + 1:o + 1 + n] for n, o in pairs],
              source_devices=[0, 1, 2], target_devices=[3, 3, 0])
    for n, o in pairs:
        assert torch.equal(out[o + 1:o + 1 + n], base[o:o + n])
    assert out[0] == 0


def test_refused_batch_names_the_leaf_and_writes_nothing(cpu4):
    sources = [torch.ones(16) for _ in range(4)] + [torch.ones(4, 4).t()]
    targets = [torch.zeros(16) for _ in range(4)] + [torch.zeros(4, 4)]
    with pytest.raises(qlink.InvalidArgumentError, match=r"sources\[4\]: not contiguous"):
        cpu4.copy(sources, targets)
    assert all(t.abs().sum() == 0 for t in targets)
    with pytest.raises(qlink.InvalidArgumentError, match=r"destinations\[1\] has 32 bytes but sources\[1\] has 64"):
        cpu4.copy([torch.ones(16), torch.ones(16)], [torch.zeros(16), torch.zeros(8)])
    with pytest.raises(qlink.InvalidArgumentError, match=r"destinations\[0\]: device id 7 does not exist"):
        cpu4.copy([torch.ones(4)], [torch.zeros(4)], target_devices=[7])
    with pytest.raises(ValueError, match="sources has 2 leaves but targets has 1"):
        cpu4.copy([torch.ones(4), torch.ones(4)], [torch.zeros(4)])


def test_prepared_plan_replays_current_contents(cpu4):
    src = [torch.randn(256) for _ in range(8)]
    dst = [torch.empty(256) for _ in range(8)]
    plan = cpu4.prepare(src, dst, source_devices=[0] * 8, target_devices=[2] * 8)
    for step in range(3):
        for s in src:
            s.add_(1.0)
        plan.run()
        assert all(torch.equal(s, d) for s, d in zip(src, dst))


def test_many_threads_copy_at_once(cpu4):
    failures = []

    def worker(seed):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(100):
            n = int(torch.randint(1, 6, (1,), generator=gen))
            src = [torch.randn(int(torch.randint(1, 5000, (1,), generator=gen)), generator=gen) for _ in range(n)]
            dst = [torch.empty_like(s) for s in src]
            cpu4.copy(src, dst, source_devices=[seed % 4] * n, target_devices=[(seed + 1) % 4] * n)
            if not all(torch.equal(s, d) for s, d in zip(src, dst)):
                failures.append(seed)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_leaf_that_is_not_a_tensor_is_named(cpu4):
    with pytest.raises(TypeError, match="leaf 1 is a str"):
        cpu4.copy([torch.ones(2), "weights"], [torch.zeros(2), torch.zeros(2)])
    with pytest.raises(TypeError, match="leaf 20 is a int"):
        cpu4.copy([torch.ones(2)] * 20 + [3], [torch.zeros(2) for _ in range(21)])


def test_wait_returns_with_the_targets_written(library):
    """wait=True on the fault backend, whose device 1 stream takes 100 ms per operation: the
    copy, the prepared copy and the broadcast return with their targets written."""
    fault = os.path.join(os.path.dirname(library), "libqlink_backend_fault.so")
    if not os.path.exists(fault):
        pytest.skip("no fault backend beside %s" % library)
    config = {"backend": fault, "log_level": "off", "backend_options": {"devices": 2, "stream_delay_ms": [0, 100]}}
    with qlink.load(config, library=library) as ctx:
        src = [torch.randn(1000), torch.randn(7)]
        calls = {
            "copy": lambda dst: ctx.copy(src, dst, source_devices=[0, 0], target_devices=[1, 1], wait=True),
            "prepared": lambda dst: ctx.prepare(src, dst, source_devices=[0, 0], target_devices=[1, 1],
                                                wait=True).run(),
            "broadcast": lambda dst: qlink.broadcast(src, [dst], ctx=ctx, source_device=0, replica_devices=[1],
                                                     wait=True),
        }
        for name, call in calls.items():
            dst = [torch.zeros(1000), torch.zeros(7)]
            start = time.perf_counter()
            call(dst)
            assert time.perf_counter() - start > 0.09, name
            assert all(torch.equal(s, d) for s, d in zip(src, dst)), name
