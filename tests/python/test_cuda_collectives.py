"""Collectives between real GPUs; skipped where PyTorch sees fewer than two."""
import itertools

import pytest
import torch

import qlink

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def _devices():
    return list(range(torch.cuda.device_count()))


@pytest.mark.parametrize("op, transport", [("sum", "fp32"), ("avg", "fp32"), ("sum", "bf16"), ("sign", "bf16")])
@pytest.mark.parametrize("n", [1, 1000, 200000, 200003, 1 << 20, (16 << 20) + 3])
def test_all_reduce(ctx, op, transport, n):
    bufs = [torch.randn(n, device=d) for d in _devices()]
    exact = torch.stack([b.double().cpu() for b in bufs]).sum(0)
    qlink.all_reduce(bufs, op=op, transport=transport)
    host = [b.cpu() for b in bufs]
    assert all(torch.equal(h, host[0]) for h in host)  # bit-identical replicas
    if op == "sign":
        clear = exact.abs() > 0.05
        assert torch.equal(host[0][clear], exact[clear].sign().float())
    else:
        ref = exact / (len(bufs) if op == "avg" else 1)
        tol = 1e-5 if transport == "fp32" else 2e-2
        assert torch.allclose(host[0].double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("op", ["sum", "avg", "sign"])
@pytest.mark.parametrize("n", [1000, (4 << 20) + 5])
def test_halving_doubling_agrees_with_fp64(ctx, op, n):
    devs = _devices()
    if len(devs) & (len(devs) - 1):
        pytest.skip("halving-doubling needs a power-of-two number of GPUs")
    bufs = [torch.randn(n, device=d) for d in devs]
    exact = torch.stack([b.double().cpu() for b in bufs]).sum(0)
    qlink.all_reduce(bufs, op=op, algorithm="halving_doubling")
    host = [b.cpu() for b in bufs]
    assert all(torch.equal(h, host[0]) for h in host)
    if op == "sign":
        clear = exact.abs() > 0.05
        assert torch.equal(host[0][clear], exact[clear].sign().float())
    else:
        ref = exact / (len(bufs) if op == "avg" else 1)
        assert torch.allclose(host[0].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1000, 1 << 20])  # one-shot, two-shot
@pytest.mark.parametrize("op, transport", [("sum", "fp32"), ("sign", "bf16")])
def test_prepared_all_reduce_replays_like_all_reduce(ctx, torch_side, n, op, transport):
    bufs = [torch.empty(n, device=d) for d in _devices()]
    plan = qlink.PreparedAllReduce(bufs, op=op, transport=transport)
    for step in range(20):
        for b in bufs:
            b.normal_()
        expected = [b.clone() for b in bufs]
        qlink.all_reduce(expected, op=op, transport=transport)
        plan.run()
        assert all(torch.equal(b, e) for b, e in zip(bufs, expected)), step


def test_reduce_bit_identical_for_every_arrival_order(ctx):
    parts = [torch.randn(4 << 20, device=d) for d in _devices()]
    outs = []
    for perm in itertools.permutations(range(len(parts))):
        out = torch.empty(4 << 20, device="cuda:0")
        qlink.reduce([parts[k] for k in perm], out, scale=2.0 / 1000)
        outs.append(out.cpu())
    assert all(torch.equal(o, outs[0]) for o in outs)
    exact = torch.stack([p.double().cpu() for p in parts]).sum(0) * 2.0 / 1000
    assert torch.allclose(outs[0].double(), exact, atol=5e-7, rtol=5e-7)


def test_reduce_waits_for_a_producer_on_the_peer(ctx):
    a = torch.zeros(1 << 20, device="cuda:1")
    b = torch.ones(1 << 20, device="cuda:0")
    producer = torch.cuda.Stream(device=1)
    with torch.cuda.stream(producer):
        torch.cuda._sleep(50_000_000)
        a.fill_(2.0)
        qlink.reduce([a, b], b)
    torch.cuda.synchronize(0)
    assert float(b.sum()) == 3.0 * b.numel()


def test_mirror_module_gives_independent_replicas(ctx):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64),
                                torch.nn.LayerNorm(64)).to("cuda:0")
    x = torch.randn(4, 64, device="cuda:0")
    expected = model(x).cpu()
    replicas = qlink.mirror_module(model, ["cuda:%d" % d for d in _devices()[1:]])
    ptrs = {p.data_ptr() for p in model.parameters()}
    for r, d in zip(replicas, _devices()[1:]):
        assert all(p.device == torch.device("cuda", d) for p in r.parameters())
        assert not ptrs & {p.data_ptr() for p in r.parameters()}
        assert torch.equal(r(x.to(d)).cpu(), expected)
    with torch.no_grad():
        replicas[0][0].weight.zero_()
    assert torch.equal(model(x).cpu(), expected)


def test_small_all_reduce_back_to_back_and_from_threads(ctx):
    """The one-shot path alternates staging slots by epoch; every call must see its own data."""
    import threading
    devs = _devices()
    for step in range(200):
        bufs = [torch.full((4096,), float(step + d), device=d) for d in devs]
        qlink.all_reduce(bufs)
        expected = float(sum(step + d for d in devs))
        assert all(float(b[0]) == expected and float(b[-1]) == expected for b in bufs), step
    failures = []

    def worker(seed):
        streams = {d: torch.cuda.Stream(device=d) for d in devs}
        for step in range(100):
            bufs = []
            for d in devs:
                with torch.cuda.stream(streams[d]):
                    bufs.append(torch.full((1000,), float(seed * 1000 + step + d), device=d))
            with torch.cuda.stream(streams[0]), torch.cuda.stream(streams[devs[-1]]):
                qlink.all_reduce(bufs, op="sum")
            for d in devs:
                streams[d].synchronize()
            if float(bufs[0][7]) != float(sum(seed * 1000 + step + d for d in devs)):
                failures.append((seed, step))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
