"""Where the replicas of a data-parallel engine live: GPUs, or the CPU backend's virtual
devices (one CPU memory, a qlink device id per replica) so CI runs every engine at any
world size."""
import concurrent.futures

import torch

from ..defaults import default_context
from ..streams import current_streams
from ..plan import resolve_plan


def parallel_devices(parallel, devices, iters, batch_size, home=None):
    """The replica devices AutoRound's `parallel_quantization` setting engages, home first
    (qlink.plan's rules; ValueError naming every reason an explicit N cannot engage)."""
    return list(resolve_plan(parallel, devices, iters, batch_size, home=home).devices)


def shard_sizes(total, world):
    """Contiguous shards, the remainder on the earlier ones (129 over 4: 33, 32, 32, 32)."""
    base, extra = divmod(total, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


class Placement:
    """Rank r's torch device and qlink device id. Rank 0 is home (docs/HOSTS.md: home first,
    then ascending)."""

    def __init__(self, devices, ctx=None):
        self.ctx = ctx or default_context()
        self.cpu = self.ctx.cpu_memory
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
                      streams=None if self.cpu else current_streams(
                          self.ctx, {self.ids[r] for r in source_ranks + target_ranks}))

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
