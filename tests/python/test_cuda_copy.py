"""Peer copies on real GPUs (the accelerator machine); skipped where PyTorch sees none."""
import collections
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import qlink

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.append(torch.float8_e4m3fn)


def _pairs():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [(0, 0)] + ([(0, 1), (1, 0)] if n >= 2 else [])


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _random(n, dtype, device, gen):
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),), generator=gen, dtype=torch.uint8)
    return raw.view(dtype).to(device)


def test_backend_sees_the_gpus(ctx):
    assert ctx.backend == "cuda"
    assert ctx.device_count == torch.cuda.device_count()
    assert ctx.devices()[0].name.startswith("NVIDIA")


@two_gpus
def test_peer_matrix_enables_every_ordered_pair(ctx):
    matrix = ctx.peer_matrix([0, 1])
    assert all(p.enabled for p in matrix.values()), matrix


@two_gpus
def test_probe_measures_each_pair(library):
    ctx = qlink.load({"backend": "cuda", "p2p": {"probe": True, "probe_mib": 16, "min_gbps": 50}}, library=library)
    for p in ctx.enable_peer_access([0, 1]).values():
        assert p.probed and p.enabled and p.peer_gbps > 50, p


@pytest.mark.parametrize("src_dev, dst_dev", _pairs())
def test_every_dtype_byte_exact(torch_side, ctx, src_dev, dst_dev):
    gen = torch.Generator().manual_seed(src_dev * 10 + dst_dev)
    sources = [_random(1000 + 37 * i, dt, "cuda:%d" % src_dev, gen) for i, dt in enumerate(DTYPES)]
    targets = [torch.zeros_like(s, device="cuda:%d" % dst_dev) for s in sources]
    qlink.peer_copy_batch(sources, targets)
    for s, t in zip(sources, targets):
        assert torch.equal(_bytes(s).cpu(), _bytes(t).cpu()), s.dtype


@pytest.mark.parametrize("src_dev, dst_dev", _pairs())
def test_odd_sizes_and_unaligned_offsets(torch_side, ctx, src_dev, dst_dev):
    base = torch.randint(0, 256, (1 << 22,), dtype=torch.uint8, device="cuda:%d" % src_dev)
    out = torch.zeros(1 << 22, dtype=torch.uint8, device="cuda:%d" % dst_dev)
    cases = [(1, 0, 5), (17, 3, 100), (4096, 1, 9000), (65537, 7, 80000), (300001, 16, 400000),
             (2 << 20, 13, 1 << 21)]  # (bytes, source offset, destination offset)
    qlink.peer_copy_batch([base[so:so + n] for n, so, do in cases], [out[do:do + n] for n, so, do in cases])
    host_base, host_out = base.cpu(), out.cpu()
    written = torch.zeros(1 << 22, dtype=torch.bool)
    for n, so, do in cases:
        assert torch.equal(host_out[do:do + n], host_base[so:so + n]), (n, so, do)
        written[do:do + n] = True
    assert int(host_out[~written].count_nonzero()) == 0  # nothing written outside the leaves


@pytest.mark.parametrize("src_dev, dst_dev", _pairs())
def test_large_leaves_take_the_copy_engines_byte_exact(ctx, src_dev, dst_dev):
    # 64 MiB: copy engines; a lone 20 MiB leaf: the pull kernel; then two of 20 MiB: copy engines.
    sources = [torch.randn(n, device="cuda:%d" % src_dev) for n in (16 << 20, 5 << 20, 3)]
    targets = [torch.empty_like(s, device="cuda:%d" % dst_dev) for s in sources]
    qlink.peer_copy_batch(sources, targets)
    assert all(torch.equal(s.cpu(), t.cpu()) for s, t in zip(sources, targets))
    sources = [torch.randn(n, device="cuda:%d" % src_dev) for n in (5 << 20, 5 << 20)]
    targets = [torch.empty_like(s, device="cuda:%d" % dst_dev) for s in sources]
    qlink.peer_copy_batch(sources, targets)
    assert all(torch.equal(s.cpu(), t.cpu()) for s, t in zip(sources, targets))


@two_gpus
def test_reader_sees_a_producer_still_running_on_the_source_stream(ctx):
    src = torch.zeros(1 << 20, device="cuda:0")
    dst = torch.empty_like(src, device="cuda:1")
    producer = torch.cuda.Stream(device=0)
    consumer = torch.cuda.Stream(device=1)
    for round_ in range(5):
        with torch.cuda.stream(producer):
            torch.cuda._sleep(50_000_000)  # about 25 ms of spinning before the fill
            src.fill_(round_ + 1)
        with torch.cuda.stream(producer), torch.cuda.stream(consumer):
            qlink.peer_copy_batch([src], [dst])
            seen = dst.sum()  # enqueued on the consumer stream right after the copy
        consumer.synchronize()
        assert float(seen) == (round_ + 1) * src.numel()


@two_gpus
def test_refused_batch_writes_nothing_on_the_gpu(ctx):
    sources = [torch.ones(1024, device="cuda:0") for _ in range(3)]
    targets = [torch.zeros(1024, device="cuda:1"), torch.zeros(1024, device="cuda:1"),
               torch.zeros(512, device="cuda:1")]
    with pytest.raises(qlink.InvalidArgumentError, match=r"destinations\[2\] has 2048 bytes but sources\[2\] has 4096"):
        qlink.peer_copy_batch(sources, targets)
    torch.cuda.synchronize()
    assert all(float(t.abs().sum()) == 0 for t in targets)


@two_gpus
def test_prepared_copy_replays(torch_side, ctx):
    sources = [torch.randn(4096 + i, device="cuda:0") for i in range(64)]
    targets = [torch.empty_like(s, device="cuda:1") for s in sources]
    prepared = qlink.PreparedCopy(sources, targets)
    for _ in range(3):
        for s in sources:
            s.mul_(1.5)
        prepared.run()
        assert all(torch.equal(s.cpu(), t.cpu()) for s, t in zip(sources, targets))


@two_gpus
@pytest.mark.parametrize("promises", [{"sources_held": True}, {"sources_ready": True, "sources_held": True}])
def test_prepared_copy_with_host_promises(torch_side, ctx, promises):
    # Small leaves take the pull kernel (descriptors in device memory), the two 9 MiB ones the copy engines.
    sources = [torch.randn(n, device="cuda:0") for n in (1, 17, 4096, 65536, 9 << 18, 9 << 18)]
    targets = [torch.empty_like(s, device="cuda:1") for s in sources]
    prepared = qlink.PreparedCopy(sources, targets, **promises)
    for _ in range(3):
        for s in sources:
            s.normal_()
        torch.cuda.synchronize(0)  # what sources_ready promises
        prepared.run()
        torch.cuda.synchronize(1)  # what sources_held promises: no write before the copy is done
        assert all(torch.equal(s.cpu(), t.cpu()) for s, t in zip(sources, targets))


@two_gpus
def test_wait_returns_once_the_targets_hold_the_data(torch_side, ctx):
    sources = [torch.randn(n, device="cuda:0") for n in (17, 65536, 9 << 18)]
    targets = [torch.zeros_like(s, device="cuda:1") for s in sources]
    prepared = qlink.PreparedCopy(sources, targets, wait=True)
    for call in (lambda: ctx.copy(sources, targets, wait=True), prepared.run,
                 lambda: qlink.broadcast(sources, [targets], wait=True)):
        for t in targets:
            t.zero_()
        with torch.cuda.device(1):
            torch.cuda._sleep(50_000_000)  # the destination stream busy for about 25 ms
        call()
        assert torch.cuda.current_stream(1).query(), "returned before the destination stream reached the copy"
        assert all(torch.equal(s.cpu(), t.cpu()) for s, t in zip(sources, targets))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 64, bias=False)
        self.norm = torch.nn.LayerNorm(64)
        self.register_buffer("steps", torch.arange(10))
        self.register_buffer("transposed", torch.randn(32, 16).t())  # not contiguous

    def forward(self, x):
        return self.norm(self.b(torch.relu(self.a(x)))) + self.transposed.sum()


@two_gpus
def test_move_module_matches_module_to(torch_side, ctx):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block()).to("cuda:0", torch.bfloat16)
    model[1].b.weight = model[0].b.weight  # tied parameter
    x = torch.randn(8, 64, device="cuda:0", dtype=torch.bfloat16)
    expected = model(x).cpu()
    ids = [id(p) for p in model.parameters()]
    qlink.move_module_to_device(model, "cuda:1")
    assert all(p.device == torch.device("cuda:1") for p in model.parameters())
    assert all(b.device == torch.device("cuda:1") for b in model.buffers())
    assert [id(p) for p in model.parameters()] == ids
    assert model[1].b.weight is model[0].b.weight
    assert torch.equal(model(x.to("cuda:1")).cpu(), expected)


@two_gpus
@pytest.mark.parametrize("experts", [3, 40])
def test_move_module_of_alike_leaves(torch_side, ctx, experts):
    # Leaves of one shape share one allocation; each parameter still gets its own bytes and
    # stays a plain leaf that trains as before.
    torch.manual_seed(0)
    model = torch.nn.ModuleList(torch.nn.Linear(32, 48) for _ in range(experts)).to("cuda:0", torch.bfloat16)
    expected = [p.detach().cpu() for p in model.parameters()]
    qlink.move_module_to_device(model, "cuda:1")
    params = list(model.parameters())
    assert all(p.device == torch.device("cuda:1") and not p._is_view() for p in params)
    assert all(torch.equal(p.detach().cpu(), e) for p, e in zip(params, expected))
    spans = sorted((p.data_ptr(), p.data_ptr() + p.nbytes) for p in params)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    model[0](torch.ones(2, 32, device="cuda:1", dtype=torch.bfloat16)).sum().backward()
    with torch.no_grad():
        model[0].weight.sub_(model[0].weight.grad)
    assert torch.equal(model[0].weight.cpu(), expected[0] - 2)


@two_gpus
@pytest.mark.parametrize("small", [2, 20])
def test_move_module_gives_large_leaves_their_own_memory(torch_side, ctx, small):
    sizes = [9 << 18] + [1000 + i for i in range(small)] + [9 << 18]  # two 9 MiB leaves among small ones
    params = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(n, device="cuda:0")) for n in sizes)
    expected = [p.detach().cpu() for p in params]
    qlink.move_module_to_device(params, "cuda:1")
    assert all(torch.equal(p.detach().cpu(), e) for p, e in zip(params, expected))
    assert params[0].untyped_storage().nbytes() == params[0].nbytes  # not a view into the shared block
    assert params[-1].untyped_storage().nbytes() == params[-1].nbytes
    if torch_side == "bridge":  # without it PyTorch moves each leaf on its own
        assert params[1].untyped_storage().nbytes() > params[1].nbytes


@two_gpus
def test_moved_nested_leaves_take_in_place_autograd(torch_side, ctx):
    # Values handed out (activations) are no multi-output views: in-place ops that autograd
    # records work on them, as on tensors moved by Tensor.to.
    leaves = [torch.randn(16, device="cuda:0") for _ in range(12)]
    moved = qlink.move_nested_to_device(leaves, "cuda:1")
    scale = torch.ones(16, device="cuda:1", requires_grad=True)
    moved[3].add_(scale)
    moved[3].sum().backward()
    assert torch.equal(scale.grad.cpu(), torch.ones(16))
    assert torch.equal(moved[3].detach().cpu(), leaves[3].cpu() + 1)


@two_gpus
def test_storage_sharing_leaves_keep_their_tie(torch_side, ctx):
    m = torch.nn.Module()
    base = torch.randn(4, 8, device="cuda:0")
    m.register_buffer("whole", base)
    m.register_buffer("row", base[1])  # a view sharing whole's storage
    qlink.move_module_to_device(m, "cuda:1")
    m.whole[1].fill_(7.0)
    assert torch.equal(m.row.cpu(), torch.full((8,), 7.0))


@two_gpus
def test_move_nested_keeps_containers(torch_side, ctx):
    Pair = collections.namedtuple("Pair", "x y")
    value = {"ids": torch.arange(100, device="cuda:0"), "list": [torch.ones(3, device="cuda:0"), "text", 5],
             "tuple": (torch.zeros(2, 2, device="cuda:0").t(), None), "pair": Pair(torch.ones(1, device="cuda:0"), 1.5),
             "host": torch.ones(2)}
    value["again"] = value["ids"]
    out = qlink.move_nested_to_device(value, "cuda:1")
    assert type(out["list"]) is list and type(out["tuple"]) is tuple and type(out["pair"]) is Pair
    assert out["list"][1:] == ["text", 5] and out["tuple"][1] is None and out["pair"].y == 1.5
    assert out["ids"].device == torch.device("cuda:1") and torch.equal(out["ids"].cpu(), torch.arange(100))
    assert out["again"] is out["ids"]
    assert torch.equal(out["tuple"][0].cpu(), torch.zeros(2, 2))
    assert out["host"].device == torch.device("cuda:1")


STRESS = textwrap.dedent("""
    import random, sys, threading, torch
    sys.path.insert(0, sys.argv[2])
    import qlink
    qlink.configure({"backend": "cuda", "log_level": "warn"}, library=sys.argv[1]).enable_peer_access()
    n_dev = torch.cuda.device_count()
    failures = []

    def worker(seed):
        rng = random.Random(seed)
        for task in range(1000):
            src_dev, dst_dev = rng.randrange(n_dev), rng.randrange(n_dev)
            sizes = [rng.choice([1, 17, 4096, 65536, 262144 + 3, 3 << 20]) for _ in range(rng.randint(1, 8))]
            dtype = rng.choice([torch.uint8, torch.float16, torch.float32])
            item = torch.empty((), dtype=dtype).element_size()
            src = [torch.randint(0, 100, (max(1, s // item),), device=src_dev).to(dtype) for s in sizes]
            dst = [torch.empty_like(s, device=dst_dev) for s in src]
            if rng.random() < 0.3:
                qlink.move_nested_to_device(src, dst_dev)
            qlink.peer_copy_batch(src, dst)
            if not all(torch.equal(s.to(dst_dev), d) for s, d in zip(src, dst)):
                failures.append((seed, task))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads: t.start()
    for t in threads: t.join()
    torch.cuda.synchronize()
    print("failures", len(failures))
    sys.exit(1 if failures else 0)
""")


@two_gpus
@pytest.mark.parametrize("process", range(3))
def test_sixteen_threads_of_mixed_copies(library, process):
    package = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    result = subprocess.run([sys.executable, "-c", STRESS, library, package], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "failures 0" in result.stdout


EXPANDABLE = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    import qlink
    early = [torch.randn(n, device="cuda:0") for n in (17, 65536)]  # mapped before peer access
    qlink.configure({"backend": "cuda", "log_level": "warn"}, library=sys.argv[1]).enable_peer_access()
    late = [torch.randn(n, device="cuda:0") for n in (4096, 1 << 20)]  # mapped after
    dst = [torch.empty_like(t, device="cuda:1") for t in early + late]
    qlink.peer_copy_batch(early + late, dst)
    assert all(torch.equal(s.cpu(), d.cpu()) for s, d in zip(early + late, dst))
    parts = [torch.randn(1 << 20, device=d) for d in (0, 1)]
    out = torch.empty_like(parts[0])
    qlink.reduce(parts, out)
    assert torch.equal(out.cpu(), parts[0].cpu() + parts[1].cpu())
    bufs = [torch.randn(4096, device=d) for d in (0, 1)]
    expected = bufs[0].cpu() + bufs[1].cpu()
    qlink.all_reduce(bufs)
    assert all(torch.equal(b.cpu(), expected) for b in bufs)
    print("ok")
""")


@two_gpus
def test_pytorch_expandable_segments_are_readable_over_the_link(library):
    """PyTorch maps expandable segments itself (cuMemMap): runtime peer access does not
    cover them, so enable_peer_access also has PyTorch grant them to the peer."""
    package = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    result = subprocess.run([sys.executable, "-c", EXPANDABLE, library, package], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr
