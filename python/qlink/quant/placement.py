"""Where the replicas of a data-parallel engine live: GPUs, or the CPU backend's virtual
devices (one host memory, a qlink device id per replica) so CI runs every engine at any
world size."""
import concurrent.futures

import torch

from ..p2p import current_streams, default_context


def _power_of_two_at_most(n):
    return 1 << (max(n, 1).bit_length() - 1)


def parallel_devices(parallel, devices, iters, batch_size, home=None):
    """The replica devices AutoRound's `parallel_quantization` setting engages (HOSTS.md):
    home first, then the others ascending. "off": home alone; "auto": the largest power of
    two of the devices when tuning (iters > 0), all of them at iters = 0; an int N: exactly
    N, or ValueError naming every reason it cannot engage (never a silent fallback). A batch
    smaller than the world demotes it to the largest power of two within the batch."""
    devices = list(devices)
    home = devices[0] if home is None else home
    index = lambda d: d if isinstance(d, int) else torch.device(d).index  # noqa: E731  ("cuda:10" after "cuda:2")
    ordered = [home] + sorted((d for d in devices if d != home), key=index)
    if parallel == "off":
        return ordered[:1]
    if parallel == "auto":
        world = _power_of_two_at_most(len(ordered)) if iters > 0 else len(ordered)
    elif isinstance(parallel, int) and not isinstance(parallel, bool):
        reasons = []
        if parallel > len(ordered):
            reasons.append("%d replicas asked, %d devices visible" % (parallel, len(ordered)))
        if parallel < 2:
            reasons.append("a data-parallel run needs at least 2 replicas, got %d" % parallel)
        if iters > 0 and parallel != _power_of_two_at_most(parallel):
            reasons.append("tuning (iters=%d) needs a power-of-two world for halving-doubling, got %d" % (
                iters, parallel))
        if reasons:
            raise ValueError("parallel_quantization=%d cannot engage: %s" % (parallel, "; ".join(reasons)))
        world = parallel
    else:
        raise ValueError("parallel_quantization must be 'off', 'auto' or an int, got %r" % (parallel,))
    if iters > 0 and batch_size < world:
        world = _power_of_two_at_most(batch_size)
    return ordered[:world]


def shard_sizes(total, world):
    """Contiguous shards, the remainder on the earlier ones (129 over 4: 33, 32, 32, 32)."""
    base, extra = divmod(total, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


class Placement:
    """Rank r's torch device and qlink device id. Rank 0 is home (HOSTS.md: home first,
    then ascending)."""

    def __init__(self, devices, ctx=None):
        self.ctx = ctx or default_context()
        self.cpu = self.ctx.backend == "cpu"
        if self.cpu:
            self.ids = [int(d) for d in devices]
            self.torch_devices = [torch.device("cpu")] * len(self.ids)
        else:
            self.torch_devices = [torch.device(d) if not isinstance(d, int) else torch.device("cuda", d)
                                  for d in devices]
            self.ids = [d.index for d in self.torch_devices]
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("devices %s: each replica needs its own device" % (list(devices),))
        self.world = len(self.ids)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.world)

    def subset(self, world):
        """The first `world` ranks (home first) as a placement of their own."""
        return Placement(self.ids[:world] if self.cpu else self.torch_devices[:world], ctx=self.ctx)

    def device_ids(self):
        """qlink device ids to pass to collectives (None on GPUs: the tensors say)."""
        return self.ids if self.cpu else None

    def copy(self, sources, targets, source_ranks, target_ranks):
        """targets[i].copy_(sources[i]) between ranks, through qlink."""
        self.ctx.copy(sources, targets, [self.ids[r] for r in source_ranks], [self.ids[r] for r in target_ranks],
                      streams=None if self.cpu else current_streams(self.ctx, {self.ids[r] for r in
                                                                              source_ranks + target_ranks}))

    def run(self, fn):
        """fn(rank) on every rank at once, each in its own thread with its device current;
        returns the results in rank order."""
        def call(rank):
            if self.cpu:
                return fn(rank)
            with torch.cuda.device(self.ids[rank]):
                return fn(rank)
        return list(self._pool.map(call, range(self.world)))

    def synchronize(self):
        if not self.cpu:
            for d in self.ids:
                torch.cuda.synchronize(d)
