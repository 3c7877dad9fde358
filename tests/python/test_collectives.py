"""Collectives from Python on the CPU backend's virtual devices (1, 2, 3, 4, 8)."""
import itertools

import pytest
import torch

import qlink


@pytest.fixture(scope="module")
def cpu8(library):
    with qlink.load({"backend": "cpu", "cpu_devices": 8, "log_level": "off"}, library=library) as ctx:
        yield ctx


WORLDS = [1, 2, 3, 4, 8]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_all_reduce_matches_fp64(cpu8, world, op):
    gen = torch.Generator().manual_seed(world)
    bufs = [torch.randn(1001, generator=gen) for _ in range(world)]
    exact = torch.stack([b.double() for b in bufs]).sum(0) / (world if op == "avg" else 1)
    qlink.all_reduce(bufs, op=op, ctx=cpu8, devices=list(range(world)))
    for b in bufs:
        assert torch.equal(b, bufs[0])
        assert torch.allclose(b.double(), exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("algorithm", ["two_shot", "halving_doubling"])
def test_explicit_algorithms_agree_with_fp64(cpu8, world, algorithm):
    gen = torch.Generator().manual_seed(50 + world)
    bufs = [torch.randn(2049, generator=gen) for _ in range(world)]
    exact = torch.stack([b.double() for b in bufs]).sum(0)
    qlink.all_reduce(bufs, ctx=cpu8, devices=list(range(world)), algorithm=algorithm)
    assert all(torch.equal(b, bufs[0]) for b in bufs)
    assert torch.allclose(bufs[0].double(), exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op, transport", [("avg", "fp32"), ("sign", "bf16")])
def test_prepared_all_reduce_replays_like_all_reduce(cpu8, world, op, transport):
    bufs = [torch.empty(777) for _ in range(world)]
    plan = qlink.PreparedAllReduce(bufs, op=op, transport=transport, ctx=cpu8, devices=list(range(world)))
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        for b in bufs:
            b.copy_(torch.randn(777, generator=gen))
        expected = [b.clone() for b in bufs]
        qlink.all_reduce(expected, op=op, transport=transport, ctx=cpu8, devices=list(range(world)))
        plan.run()
        assert all(torch.equal(b, e) for b, e in zip(bufs, expected)), seed


@pytest.mark.parametrize("world", WORLDS)
def test_sign_cast_replicas_bit_identical(cpu8, world):
    gen = torch.Generator().manual_seed(100 + world)
    bufs = [torch.randn(999, generator=gen) for _ in range(world)]
    exact = torch.stack([b.double() for b in bufs]).sum(0)
    qlink.all_reduce(bufs, op="sign", transport="bf16", ctx=cpu8, devices=list(range(world)))
    assert all(torch.equal(b, bufs[0]) for b in bufs)
    clear = exact.abs() > 0.05
    assert torch.equal(bufs[0][clear], exact[clear].sign().float())


@pytest.mark.parametrize("world", [3, 4])
def test_reduce_bit_identical_for_every_arrival_order(cpu8, world):
    gen = torch.Generator().manual_seed(7)
    parts = [torch.randn(256, generator=gen) for _ in range(world)]
    parts[0][0], parts[1][0], parts[2][0] = 1e20, -1e20, 1.0  # cancels to exactly 1 in device order only
    for p in parts[3:]:
        p[0] = 0.0
    results = []
    for perm in itertools.permutations(range(world)):
        out = torch.zeros(256)
        qlink.reduce([parts[k] for k in perm], out, scale=2.0 / 10, ctx=cpu8, input_devices=list(perm),
                     output_device=0)
        results.append(out)
    assert all(torch.equal(r, results[0]) for r in results)
    assert results[0][0] == torch.tensor(1.0 * 2.0 / 10)


def test_broadcast_and_refusal(cpu8):
    src = [torch.randn(10), torch.arange(7, dtype=torch.int64)]
    replicas = [[torch.zeros(10), torch.zeros(7, dtype=torch.int64)] for _ in range(3)]
    qlink.broadcast(src, replicas, ctx=cpu8, source_device=0, replica_devices=[1, 2, 3])
    assert all(torch.equal(r[0], src[0]) and torch.equal(r[1], src[1]) for r in replicas)
    with pytest.raises(qlink.InvalidArgumentError, match=r"buffers\[1\]: dtype must be float32"):
        qlink.all_reduce([torch.zeros(4), torch.zeros(4, dtype=torch.float16)], ctx=cpu8, devices=[0, 1])
    with pytest.raises(ValueError, match="op must be one of"):
        qlink.all_reduce([torch.zeros(4)], op="max", ctx=cpu8, devices=[0])


def test_multi_process_transport_is_refused_on_cpu(cpu8):
    with pytest.raises(qlink.UnavailableError, match="the cpu backend has no NCCL transport"):
        qlink.unique_id(cpu8)
    with pytest.raises(ValueError, match="unique id must be 128 bytes"):
        qlink.Communicator(cpu8, b"short", 2, 0, 0)


def test_prepared_all_reduces_from_many_threads(cpu8):
    """Each thread replays its own plan; plans of one context run side by side."""
    import threading
    failures = []

    def worker(seed):
        bufs = [torch.empty(333) for _ in range(4)]
        plan = qlink.PreparedAllReduce(bufs, ctx=cpu8, devices=[0, 1, 2, 3])
        for step in range(200):
            for d, b in enumerate(bufs):
                b.fill_(float(seed + step + d))
            plan.run()
            if not all(torch.equal(b, torch.full((333,), float(4 * (seed + step) + 6))) for b in bufs):
                failures.append((seed, step))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
