"""Host tensors to a device through pinned twins (qlink.pinned_staging, the moves of
qlink.integrations.gptqmodel): on the fault backend, whose device 1 stream takes 100 ms per
operation, a copy that returned before its stream ran would leave wrong bytes; twins kept,
reused, refreshed after an in-place change and retired when their source dies; refusals
that copy nothing. With a GPU, the stand-in GPTQModel's forward stages its host
calibration batches through the twins, and a failing staging falls back or raises; the
calibration cache GPTQModel's capture returns moves to the one GPU once (or stays, and
says why), and layer 0's landing finds its page-locked blocks made during the capture."""
import contextlib
import gc
import itertools
import os
import re
import threading
import time
import weakref

import pytest
import torch

import qlink
from qlink import pinned_staging
from qlink.pinned_staging import PinnedStaging
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.patches import FallbackRefused
from qlink.moves import map_nested, nested_tensors
from qlink.replicas import replicate_tree

from stand_in_hosts import stand_in


@pytest.fixture
def slow(library):
    fault = os.path.join(os.path.dirname(library), "libqlink_backend_fault.so")
    if not os.path.exists(fault):
        pytest.skip("no fault backend beside %s" % library)
    config = {"backend": fault, "log_level": "off", "backend_options": {"devices": 2, "stream_delay_ms": [0, 100]}}
    with qlink.load(config, library=library) as ctx:
        yield ctx


def _batch(seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 2048, generator=gen).to(torch.bfloat16), torch.randint(0, 32000, (1, 2048), generator=gen),
            torch.ones(1, 2048, dtype=torch.bool), torch.randn(3, generator=gen).half()]


def test_staged_copies_arrive_whole_after_a_slow_stream(slow):
    staging = PinnedStaging(slow)
    sources = _batch(0)
    start = time.perf_counter()
    moved = staging.to_device(sources, 1, keep=True)
    for s, m in zip(sources, moved):  # read at once: a copy not waited for is still on the slow stream
        assert m.dtype == s.dtype and m.shape == s.shape and torch.equal(m, s) and m.data_ptr() != s.data_ptr()
    assert time.perf_counter() - start > 0.09
    counts = staging.counters()
    assert counts["copies"] == 1 and counts["leaves"] == 4 and counts["twins_made"] == 4 and counts["kept"] == 4
    assert counts["bytes_copied"] == sum(s.numel() * s.element_size() for s in sources) == counts["bytes_pinned"]


def test_kept_twins_are_reused_refreshed_after_a_change_and_retired_with_their_source(slow):
    staging = PinnedStaging(slow)
    sources = _batch(1)
    staging.to_device(sources, 1, keep=True)
    again = staging.to_device(sources, 1, keep=True)
    assert all(torch.equal(s, m) for s, m in zip(sources, again))
    assert staging.counters()["twins_reused"] == 4 and staging.counters()["bytes_pinned"] == staging.counters()[
        "bytes_copied"] / 2
    sources[0].add_(1)  # in place: the twin's bytes are stale
    changed = staging.to_device(sources, 1, keep=True)
    assert torch.equal(changed[0], sources[0]) and not torch.equal(changed[0], again[0])
    counts = staging.counters()
    assert counts["twins_refreshed"] == 1 and counts["twins_reused"] == 7 and counts["kept"] == 4
    del sources[1]
    gc.collect()
    staging.to_device(sources[:1], 1, keep=True)  # sweeps the retired twins (their copies are done)
    counts = staging.counters()
    assert counts["kept"] == 3 and counts["retiring"] == 0


@contextlib.contextmanager
def _held_in_its_copy(staging, sources, device):
    """A kept move of `sources` to `device` on another thread, held (its twins taken, its copy
    not yet enqueued) while the block runs; then let go and joined."""
    entered, proceed, copy = threading.Event(), threading.Event(), staging._copy

    def gated(*args, **kwargs):
        if threading.current_thread() is mover:
            entered.set()
            proceed.wait(10)
        return copy(*args, **kwargs)
    staging._copy = gated
    mover = threading.Thread(target=staging.to_device, args=(sources, device), kwargs={"keep": True})
    mover.start()
    try:
        assert entered.wait(10)
        yield
    finally:
        proceed.set()
        mover.join()
        staging._copy = copy


def test_a_twin_retired_while_a_move_copies_from_it_is_held_until_that_copy_is_recorded(slow):
    """Another thread changes a source in place while a move copies from its kept twin: the
    refreshed-out twin waits in `retiring` for that move, not only for copies already recorded."""
    staging = PinnedStaging(slow)
    sources = _batch(2)
    staging.to_device(sources, 0, keep=True)
    with _held_in_its_copy(staging, sources, 1):
        sources[0].add_(1)
        staging.to_device(sources[:1], 0, keep=True)  # refreshes the twin the mover holds
        staging.to_device(sources[1:2], 0, keep=True)  # sweeps
        counts = staging.counters()
    assert counts["retiring"] == 1 and counts["twins_refreshed"] == 1
    staging.to_device(sources[1:2], 0, keep=True)
    assert staging.counters()["retiring"] == 0


def _tracked(staging):
    return {id(entry[1]) for entry in staging._twins.values()} | {id(tw) for tw in staging._retiring}


def test_two_moves_of_one_source_that_both_miss_leave_no_twin_untracked(library, monkeypatch):
    """Two threads move one kept source at once and both make a twin: the one stored first
    is retired when the other takes its place (a twin in neither books would be freed with
    its copy maybe still queued)."""
    with qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library) as ctx:
        staging, source = PinnedStaging(ctx), torch.randn(4096)
        made, both_made = [], threading.Barrier(2)

        class Met(pinned_staging._Twin):
            """A twin made once the other move has made one too: both missed."""
            __slots__ = ()

            def __init__(self, *args):
                super().__init__(*args)
                made.append(self)
                try:
                    both_made.wait(1.0)
                except threading.BrokenBarrierError:  # the other move found this twin: no race to show
                    pass
        monkeypatch.setattr(pinned_staging, "_Twin", Met)
        moved = {}
        threads = [threading.Thread(target=lambda d=d: moved.update({d: staging.to_device([source], d, keep=True)[0]}))
                   for d in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(made) == 2 and all(torch.equal(m, source) for m in moved.values())
        assert [id(tw) in _tracked(staging) for tw in made] == [True, True]


def test_a_release_while_a_move_holds_its_twin_keeps_that_twin_until_copied(library):
    """release() on one thread while a move on another has taken a kept twin but not yet
    copied from it: the twin stays retiring until that copy is done."""
    with qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library) as ctx:
        staging, source = PinnedStaging(ctx), torch.randn(4096)
        staging.to_device([source], 0, keep=True)
        twin = next(iter(staging._twins.values()))[1]
        with _held_in_its_copy(staging, [source], 1):
            staging.release()
            kept = id(twin) in _tracked(staging)
        assert kept
        staging.to_device([torch.randn(8)], 0)  # sweeps: the copy is done, the twin freed
        assert id(twin) not in _tracked(staging)


def test_inference_tensors_arrive_whole_and_keep_no_twin(slow):
    # GPTQModel captures its inputs under inference_mode: no version counter to see a change
    # by, so each move copies afresh (and its twin is retired, not kept).
    staging = PinnedStaging(slow)
    with torch.inference_mode():
        sources = _batch(3)
    for _ in range(2):
        moved = staging.to_device(sources, 1, keep=True)
        assert all(torch.equal(s, m) for s, m in zip(sources, moved))
    counts = staging.counters()
    assert counts["inference_sources"] == 8 and counts["twins_reused"] == 0 and counts["kept"] == 0


def test_one_time_moves_keep_no_twin(slow):
    staging = PinnedStaging(slow)
    sources = _batch(2)
    moved = staging.to_device(sources, 0)
    assert all(torch.equal(s, m) for s, m in zip(sources, moved))
    assert staging.counters()["kept"] == 0 and staging.counters()["twins_made"] == 4
    staging.to_device(sources, 0)
    assert staging.counters()["twins_reused"] == 0 and staging.counters()["twins_made"] == 8


@pytest.fixture
def small_stream(monkeypatch):
    """Streamed moves from 4 KiB on, through slots of 1 KiB: a few tensors stream through
    several turns of the slots."""
    monkeypatch.setattr(pinned_staging, "STREAM_MIN_BYTES", 4096)
    monkeypatch.setattr(pinned_staging, "SLOT_BYTES", 1024)


def test_a_large_one_time_move_streams_through_the_slots_and_arrives_whole(slow, small_stream):
    staging = PinnedStaging(slow)
    gen = torch.Generator().manual_seed(4)
    sources = [torch.randn(700, generator=gen), torch.randint(0, 1 << 30, (333,), generator=gen),
               torch.randn(5, generator=gen).half()]  # 2800 + 2664 + 10 bytes: uneven chunks
    moved = staging.to_device(sources, 1)
    assert all(m.dtype == s.dtype and torch.equal(m, s) for s, m in zip(sources, moved))
    counts = staging.counters()
    assert counts["streamed"] == 3 and counts["twins_made"] == 0 and counts["bytes_streamed"] == 5474
    assert counts["copies"] == 6  # one a slot's fill: 5474 bytes in slots of 1 KiB
    staging.release()
    assert all(torch.equal(s, m) for s, m in zip(sources, staging.to_device(sources, 0)))


def test_small_tensors_streamed_share_a_slots_copy(slow, small_stream):
    staging = PinnedStaging(slow)
    sources = [torch.full((32,), float(i)) for i in range(40)]  # 40 tensors of 128 bytes: 5 KiB together
    moved = staging.to_device(sources, 1)
    assert all(torch.equal(m, s) for s, m in zip(sources, moved))
    assert staging.counters()["copies"] == 5 and staging.counters()["streamed"] == 40


@pytest.mark.parametrize("sizes", [[2800, 2664, 10], [1024, 1024], [1, 5000, 0, 3], [0]])
def test_slot_fills_cover_each_run_once_in_order(sizes):
    fills = pinned_staging._slot_fills(sizes, 1024)
    pieces = [piece for fill in fills for piece in fill]
    assert [(run, offset) for run, offset, _, _ in pieces] == sorted((run, offset) for run, offset, _, _ in pieces)
    for run, total in enumerate(sizes):
        runs = [(offset, size) for r, offset, _, size in pieces if r == run]
        assert sum(size for _, size in runs) == total
        starts = list(itertools.accumulate([0] + [size for _, size in runs]))[:len(runs)]
        assert [offset for offset, _ in runs] == starts
    for fill in fills:
        assert [at for _, _, at, _ in fill] == list(itertools.accumulate([0] + [size for *_, size in fill[:-1]]))
        assert sum(size for *_, size in fill) <= 1024
    assert all(sum(size for *_, size in fill) == 1024 for fill in fills[:-1])


def test_kept_and_small_moves_keep_their_twins(slow, small_stream):
    staging = PinnedStaging(slow)
    large = [torch.randn(2048)]
    staging.to_device(large, 1, keep=True)  # kept for the next move: twinned however large
    staging.to_device([torch.randn(100)], 1)  # below STREAM_MIN_BYTES
    counts = staging.counters()
    assert counts["streamed"] == 0 and counts["twins_made"] == 2 and counts["kept"] == 1


def test_copies_land_in_the_tensors_given(slow):
    staging = PinnedStaging(slow)
    sources = [torch.randn(3, 5), torch.randn(3, 5)]
    stacked = torch.zeros(2, 3, 5)
    into = list(stacked.unbind(0))
    moved = staging.to_device(sources, 1, into=into)
    assert all(m is i for m, i in zip(moved, into)) and torch.equal(stacked, torch.stack(sources))


@pytest.mark.parametrize("into, reason", [
    (lambda: [torch.zeros(3, 5)], "into has 1 tensors for 2 sources"),
    (lambda: [torch.zeros(3, 5), 7], "into\\[1\\] is a int, not a tensor"),
    (lambda: [torch.zeros(3, 5), torch.zeros(5, 3)], "into\\[1\\]: shape is \\(5, 3\\), expected \\(3, 5\\)"),
    (lambda: [torch.zeros(3, 5), torch.zeros(3, 5).half()], "into\\[1\\]: dtype is torch.float16"),
    (lambda: [torch.zeros(3, 5), torch.zeros(5, 3).t()], "into\\[1\\]: contiguous is False"),
])
def test_bad_destinations_are_named_and_nothing_is_copied(slow, into, reason):
    staging = PinnedStaging(slow)
    with pytest.raises(ValueError, match=reason):
        staging.to_device([torch.randn(3, 5), torch.randn(3, 5)], 1, into=into())
    assert staging.counters()["copies"] == 0 and staging.counters()["twins_made"] == 0


@pytest.mark.parametrize("bad, reason", [
    (lambda: torch.randn(4, 4).t(), "sources\\[1\\] cannot be staged: a non-contiguous tensor"),
    (lambda: torch.randn(4, requires_grad=True), "sources\\[1\\] cannot be staged: a tensor that requires grad"),
    (lambda: torch.empty(0), "sources\\[1\\] cannot be staged: an empty tensor"),
    (lambda: 3, "sources\\[1\\] cannot be staged: a int, not a tensor"),
])
def test_a_refused_leaf_is_named_and_nothing_is_copied(slow, bad, reason):
    staging = PinnedStaging(slow)
    with pytest.raises(ValueError, match=reason):
        staging.to_device([torch.ones(3), bad()], 1)
    assert staging.counters()["copies"] == 0 and staging.counters()["twins_made"] == 0


@pytest.mark.parametrize("bad", [lambda: torch.ones(3), lambda: 3])
def test_a_leaf_that_is_no_gpu_tensor_is_not_streamed_back_and_named(slow, bad):
    staging = PinnedStaging(slow)
    with pytest.raises(ValueError, match="sources\\[0\\] cannot be streamed to the host: it must be a contiguous GPU"):
        staging.to_host([bad()])
    assert staging.counters()["streamed_back"] == 0


def test_a_device_the_backend_lacks_is_refused(slow):
    staging = PinnedStaging(slow)
    with pytest.raises(ValueError, match="device 2 does not exist: the fault backend has 2"):
        staging.to_device([torch.ones(3)], 2)
    assert staging.counters()["twins_made"] == 0


def test_the_package_context_owns_one_staging(slow):
    assert slow.pinned_staging is slow.pinned_staging


# -- with a GPU: the stand-in GPTQModel's loop ---------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture
def gpu_host(library):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.looper import forward_executor
        from gptqmodel.utils import model
        ctx = qlink.load({"backend": "cuda", "log_level": "off"}, library=library)
        yield dict(forward_executor=forward_executor, model=model, ctx=ctx)


class Scaled(torch.nn.Linear):
    def forward(self, x, scale, mask):
        return super().forward(x) * scale[0] + mask.to(x.dtype).sum()


@cuda
def test_the_loops_host_batches_go_to_the_gpu_through_kept_twins(gpu_host):
    adapter.install(ctx=gpu_host["ctx"], strict=True)
    layer = Scaled(64, 64).cuda()
    inputs = [[torch.randn(2, 64)] for _ in range(6)]
    kwargs = [{"scale": [torch.tensor(2.0)], "mask": torch.ones(2, 64, dtype=torch.bool)} for _ in range(6)]
    run = gpu_host["forward_executor"].ForwardExecutor().run_parallel
    with torch.no_grad():
        want = [layer(x[0].cuda(), [k["scale"][0].cuda()], k["mask"].cuda()) for x, k in zip(inputs, kwargs)]
        for _ in range(3):  # three passes over the same cache: one twin per host leaf, reused after
            outputs = run(module=layer, layer_inputs=inputs, layer_input_kwargs=kwargs,
                          devices=[torch.device("cuda:0")])
            torch.cuda.synchronize()
            assert all(torch.equal(o, w) for o, w in zip(outputs, want))
    counts = adapter.counters()["staging"]
    assert counts["twins_made"] == 18 and counts["twins_reused"] == 36 and counts["kept"] == 18
    assert adapter.counters()["seams"]["nested_move_to"]["fallback"] == 0


@cuda
def test_a_failing_staging_falls_back_or_raises_when_strict(gpu_host, monkeypatch):
    ctx = gpu_host["ctx"]

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(ctx.pinned_staging, "to_device", broken)
    adapter.install(ctx=ctx)
    x = torch.arange(8.0)
    assert torch.equal(gpu_host["model"].move_to(x, torch.device("cuda:0")).cpu(), x)
    assert adapter.counters()["seams"]["move_to"]["fallback"] == 1
    adapter.install(ctx=ctx, strict=True)
    with pytest.raises(FallbackRefused, match="move_to failed and strict=True.*injected"):
        gpu_host["model"].move_to(x, torch.device("cuda:0"))


@cuda
def test_a_page_locked_source_is_read_in_place_after_the_work_before_it(gpu_host):
    """A pinned source still being written by an asynchronous device-to-host copy on the
    current stream: staged in place, in stream order, so it arrives as written."""
    ctx = gpu_host["ctx"]
    produced = torch.randn(1 << 20, device="cuda:0")
    torch.cuda._sleep(50_000_000)  # the copy below waits behind this on the stream
    pinned = torch.empty(1 << 20, pin_memory=True)
    pinned.copy_(produced, non_blocking=True)
    moved = ctx.move_tensors([pinned], "cuda:0", keep_host_copies=True)[0]
    assert torch.equal(moved, produced)
    assert ctx.pinned_staging.counters()["pinned_sources"] == 1 and ctx.pinned_staging.counters()["kept"] == 0


@cuda
def test_a_streamed_module_move_arrives_whole_behind_the_streams_work(gpu_host):
    """A module's weights moved once, larger than STREAM_MIN_BYTES: streamed through the
    slots, each slot refilled only after its copy ran behind the stream's earlier work."""
    ctx = gpu_host["ctx"]
    module = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 2048))  # 96 MiB fp32
    want = [p.detach().clone() for p in module.parameters()]
    torch.cuda._sleep(50_000_000)  # the stream is busy when the move starts
    ctx.move_module_to_device(module, "cuda:0")
    assert all(p.is_cuda and torch.equal(p.cpu(), w) for p, w in zip(module.parameters(), want))
    counts = ctx.pinned_staging.counters()
    assert counts["streamed"] == 4 and counts["twins_made"] == 0 and counts["bytes_streamed"] >= 96 << 20


def _capture(calibration):
    """A capture as GPTQModel's: per batch its hidden states, kwargs (rotary tables as a
    tuple), position ids and mask (None where sdpa needs none), in CPU memory."""
    from gptqmodel.looper.input_cache import InputCache
    gen = torch.Generator().manual_seed(calibration)
    hidden = [[torch.randn(1, 16, 64, generator=gen).to(torch.bfloat16)] for _ in range(4)]
    kwargs = [{"position_embeddings": (torch.randn(1, 16, 8, generator=gen), torch.randn(1, 16, 8, generator=gen)),
               "use_cache": False} for _ in range(4)]
    return InputCache(hidden, kwargs, [torch.arange(16).unsqueeze(0) for _ in range(4)], [None] * 4)


def _looper(device="cuda:0"):
    from gptqmodel.looper.module_looper import ModuleLooper
    config = type("QuantizeConfig", (), {"device": device})()
    return ModuleLooper(gptq_model=type("Model", (), {"quantize_config": config})(), capture=_capture)


def _leaves(cache):
    return nested_tensors([cache.layer_inputs, cache.layer_input_kwargs, cache.position_ids, cache.attention_masks])


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        yield


def test_the_nested_walks_hold_no_tensor_once_they_return():
    """nested_tensors, map_nested and replicate_tree leave no reference cycle behind: what
    they walked is freed as soon as the caller lets it go (a batch's GPU tensors, a
    replica's), not at the cyclic collector's next run."""
    enabled = gc.isenabled()
    gc.disable()  # what a collection between the call and the check would hide
    try:
        walked = [torch.randn(8), torch.randn(8)]
        module = torch.nn.Sequential(torch.nn.Linear(2, 2))
        copies = {id(p): p.detach().clone() for p in module.parameters()}
        refs = [weakref.ref(t) for t in walked + list(copies.values())]
        nested_tensors({"a": [walked[0]]})
        map_nested({"a": (walked[1],)}, lambda ts: [t.clone() for t in ts])
        replicate_tree(module, copies)  # the replica dropped at once
        del walked, copies
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        if enabled:
            gc.enable()


def test_on_the_cpu_backend_the_capture_stays_in_host_memory(host, library):
    adapter.install(ctx=qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library))
    cache = _looper().loop(0)
    assert all(t.device.type == "cpu" for t in _leaves(cache))
    assert adapter.counters()["seams"]["cache_inputs"]["reasons"] == {"the cpu backend computes in CPU memory": 1}
    assert adapter.counters()["seams"]["pinned_warmup"]["reasons"] == {"the cpu backend computes in CPU memory": 1}


def test_a_warm_up_nothing_would_use_is_refused_and_named(monkeypatch):
    from qlink import moves
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the refusals come before any GPU call
    small = [torch.empty(16, 16, device="meta")]
    assert moves.warm_pinned_host(small) == "1024 bytes would not land page-locked (PINNED_MIN_BYTES)"
    monkeypatch.setattr(moves, "WARMUP_MAX_BYTES", 1 << 20)
    large = [torch.empty(1024, 1024, device="meta")]  # 4 MiB: more than the warm-up may take
    assert moves.warm_pinned_host(large) == "no tensor fits WARMUP_MAX_BYTES (1048576)"


one_gpu = pytest.mark.skipif(torch.cuda.device_count() != 1, reason="needs exactly one GPU")


@one_gpu
def test_the_capture_moves_to_the_gpu_once_as_the_same_bytes(gpu_host):
    adapter.install(ctx=gpu_host["ctx"], strict=True)
    host_cache = _capture(0)
    looper = _looper("cuda")
    looper.capture = lambda calibration: host_cache
    cache = looper.loop(0)
    assert type(cache) is type(host_cache) and cache is not host_cache
    leaves, host_leaves = _leaves(cache), _leaves(host_cache)
    assert len(leaves) == len(host_leaves) == 4 * 4
    for moved, source in zip(leaves, host_leaves):
        assert moved.device == torch.device("cuda", 0) and source.device.type == "cpu"  # the host's left as it was
        assert moved.dtype == source.dtype and torch.equal(moved.cpu(), source) and moved.is_inference()
    assert cache.attention_masks == [None] * 4 and cache.layer_input_kwargs[0]["use_cache"] is False
    assert isinstance(cache.layer_input_kwargs[0]["position_embeddings"], tuple)
    assert adapter.counters()["seams"]["cache_inputs"]["qlink"] == 1
    # A forward's move of a cached tensor then finds it where it goes.
    staged = adapter.counters()["staging"]["leaves"]
    assert gpu_host["model"].move_to(cache.position_ids[0], torch.device("cuda:0")) is cache.position_ids[0]
    assert adapter.counters()["staging"]["leaves"] == staged


@one_gpu
def test_a_cache_of_64_mib_or_more_streams_to_the_gpu_as_the_same_bytes(gpu_host):
    adapter.install(ctx=gpu_host["ctx"], strict=True)
    gen = torch.Generator().manual_seed(3)
    host_cache = _capture(0)
    host_cache.layer_inputs[:] = [[torch.randn(1, 2048, 4096, generator=gen).to(torch.bfloat16)] for _ in range(4)]
    looper = _looper("cuda")
    looper.capture = lambda calibration: host_cache
    streamed = adapter.counters()["staging"]["bytes_streamed"]
    cache = looper.loop(0)
    assert adapter.counters()["staging"]["bytes_streamed"] - streamed >= 4 * 2048 * 4096 * 2
    for moved, source in zip(_leaves(cache), _leaves(host_cache)):
        assert moved.device == torch.device("cuda", 0) and moved.is_inference()
        assert moved.dtype == source.dtype and torch.equal(moved.cpu(), source)


@one_gpu
def test_layer_zeros_landing_finds_its_page_locked_blocks_made_during_the_capture(gpu_host):
    adapter.install(ctx=gpu_host["ctx"], strict=True)
    torch._C._host_emptyCache()  # no freed block of an earlier test serves the landing
    layer = torch.nn.Linear(2000, 5000, device="meta")  # a 40 MB weight: a 64 MiB block
    looper = _looper("cuda")
    looper.layers = [layer]
    looper.loop(0)
    assert adapter.counters()["seams"]["pinned_warmup"]["qlink"] == 1
    for thread in threading.enumerate():
        if thread.name == "qlink-pinned-warmup":
            thread.join()
    made = torch.cuda.host_memory_stats()["num_host_alloc"]
    solved = [torch.randn(p.shape, device="cuda:0") for p in layer.parameters()]
    landed = gpu_host["ctx"].move_tensors(solved, "cpu")
    assert all(t.is_pinned() and torch.equal(t, s.cpu()) for t, s in zip(landed, solved))
    assert torch.cuda.host_memory_stats()["num_host_alloc"] == made  # every block was there


@one_gpu
def test_a_layer_too_small_to_land_page_locked_is_not_warmed(gpu_host):
    adapter.install(ctx=gpu_host["ctx"], strict=True)
    looper = _looper("cuda")
    looper.layers = [torch.nn.Linear(16, 16, device="meta")]
    looper.loop(0)
    (said,) = adapter.counters()["seams"]["pinned_warmup"]["reasons"]
    assert said.endswith("bytes would not land page-locked (PINNED_MIN_BYTES)")


@one_gpu
@pytest.mark.parametrize("device, share, reason", [
    ("cpu", 0.5, "the layers run on cpu"),
    ("cuda:0", 1e-12, r"the cache \(0.00 GiB\) would take more than 0 % of cuda:0's free"),
])
def test_a_cache_that_should_stay_stays_and_says_why(gpu_host, monkeypatch, device, share, reason):
    from qlink.integrations.gptqmodel import input_cache
    monkeypatch.setattr(input_cache, "FREE_SHARE", share)
    adapter.install(ctx=gpu_host["ctx"], strict=True)
    cache = _looper(device).loop(0)
    assert all(t.device.type == "cpu" for t in _leaves(cache))
    (said,) = adapter.counters()["seams"]["cache_inputs"]["reasons"]
    assert re.match(reason, said), said


@one_gpu
def test_a_failed_move_returns_the_hosts_cache_or_raises_when_strict(gpu_host, monkeypatch):
    ctx = gpu_host["ctx"]

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(ctx, "move_tensors", broken)  # the cache's move to the GPU (input_cache.on_device)
    adapter.install(ctx=ctx)
    host_cache = _capture(1)
    looper = _looper()
    looper.capture = lambda calibration: host_cache
    assert looper.loop(1) is host_cache
    assert adapter.counters()["seams"]["cache_inputs"]["fallback"] == 1
    adapter.install(ctx=ctx, strict=True)
    with pytest.raises(FallbackRefused, match="cache_inputs failed and strict=True.*injected"):
        looper.loop(1)


@cuda
def test_gpu_tensors_land_in_page_locked_memory_complete_when_returned(gpu_host):
    """A layer moved to the host (GPTQModel's post_quantize): its tensors copied behind the
    work queued before them, in page-locked memory, complete when the call returns; small
    batches, tensors that need autograd and tensors sharing a storage move by PyTorch."""
    ctx = gpu_host["ctx"]
    big = [torch.randn(1 << 18, device="cuda:0") for _ in range(4)]
    torch.cuda._sleep(50_000_000)  # the copies wait behind this on the stream
    expected = [b.mul(3) for b in big]  # queued after the sleep: read too early, the copies are stale
    moved = ctx.move_tensors(expected, "cpu")
    assert all(m.device.type == "cpu" and m.is_pinned() and torch.equal(m, e.cpu()) for m, e in zip(moved, expected))
    small = ctx.move_tensors([torch.ones(8, device="cuda:0")], "cpu")[0]
    assert not small.is_pinned() and torch.equal(small, torch.ones(8))
    grad = torch.randn(1 << 20, device="cuda:0", requires_grad=True)
    (landed,) = ctx.move_tensors([grad], "cpu")
    assert landed.grad_fn is not None and not landed.is_pinned()
    base = torch.randn(1 << 20, device="cuda:0")
    a, b = ctx.move_tensors([base[: 1 << 19], base[1 << 19:]], "cpu")
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    layer = torch.nn.Linear(1024, 1024).cuda()
    weight = layer.weight
    ctx.move_module_to_device(layer, "cpu")
    assert layer.weight is weight and weight.device.type == "cpu" and weight.requires_grad and weight.is_pinned()


@cuda
def test_gpu_tensors_leaving_for_good_stream_back_to_pageable_memory(gpu_host):
    """pageable=True (tensors leaving the GPU for good): a move of STREAM_MIN_BYTES or more
    streamed back through the staging's slots behind the work queued before it (20 MiB
    tensors: a slot and a part each), in pageable memory, complete when the call returns;
    a smaller move by PyTorch."""
    ctx = gpu_host["ctx"]
    big = [torch.randn(5 << 20, device="cuda:0") for _ in range(4)]
    torch.cuda._sleep(50_000_000)  # the copies wait behind this on the stream
    expected = [b.mul(3) for b in big] + [torch.arange(999, device="cuda:0", dtype=torch.int16)]
    before = ctx.pinned_staging.counters()["streamed_back"]
    moved = ctx.move_tensors(expected, "cpu", pageable=True)
    assert all(m.device.type == "cpu" and not m.is_pinned() and m.dtype == e.dtype and torch.equal(m, e.cpu())
               for m, e in zip(moved, expected))
    assert ctx.pinned_staging.counters()["streamed_back"] - before == 5
    small = ctx.move_tensors([torch.ones(8, device="cuda:0")], "cpu", pageable=True)[0]
    assert not small.is_pinned() and torch.equal(small, torch.ones(8))
    assert ctx.pinned_staging.counters()["streamed_back"] - before == 5
