"""The data-parallel plan: which devices AutoRound's `parallel_quantization` engages
(docs/HOSTS.md), with every reason a device or a size was left out.

    off   home alone.
    auto  home first, then the other devices ascending; the largest power of two of those
          that pass the memory guard when tuning (iters > 0: halving-doubling needs it),
          all of them at iters = 0. Fewer than two: serial, saying why.
    N     exactly N, or PlanRefused naming every reason it cannot engage: more than visible,
          fewer than 2, not a power of two when tuning, home not an accelerator, the block
          spread over several devices, devices short of memory. Never a silent fallback.

Then, when tuning, a batch smaller than the world demotes it to the largest power of two
within the batch (every replica needs a sample). The memory guard: each replica device
other than home (which holds the block already) needs the mirror's bytes plus a 2 GiB
margin free; the guard names each device it turns away and what it lacked."""
import dataclasses

GIB = 1 << 30
MARGIN_BYTES = 2 * GIB


class PlanRefused(ValueError):
    """An explicit parallel_quantization=N that cannot engage; the message names every
    reason."""

    def __init__(self, parallel, reasons):
        super().__init__("parallel_quantization=%s cannot engage: %s" % (parallel, "; ".join(reasons)))
        self.reasons = list(reasons)


@dataclasses.dataclass(frozen=True)
class Plan:
    parallel: object    # what was asked: "off", "auto" or an int
    iters: int
    batch_size: int
    devices: tuple      # the replicas' devices, home first (as the caller named them)
    left_out: tuple     # every reason a device or a size was left out, in the order met

    @property
    def world(self):
        return len(self.devices)

    def describe(self):
        """The plan as the `qlink plan` command prints it."""
        lines = ["parallel_quantization=%s, iters=%d, batch_size=%d" % (self.parallel, self.iters, self.batch_size),
                 "world: %d%s" % (self.world, " (serial)" if self.world < 2 else ""),
                 "devices: %s" % ", ".join("%s%s" % (d, " (home)" if i == 0 else "")
                                           for i, d in enumerate(self.devices))]
        lines.append("left out:" + ("" if self.left_out else " nothing"))
        lines += ["  " + reason for reason in self.left_out]
        return "\n".join(lines)


def power_of_two_at_most(n):
    return 1 << (max(n, 1).bit_length() - 1)


def device_index(device):
    """The index that orders a device: an int as is, "cuda:10" after "cuda:2"."""
    if isinstance(device, int):
        return device
    text = str(device)
    return int(text.rpartition(":")[2]) if ":" in text else 0


def _gib(n):
    return "%.1f GiB" % (n / GIB)


def mirror_need(parts):
    """(total bytes, "block 6.0 GiB + tuning 0.5 GiB + ... + margin 2.0 GiB") for the
    named byte counts a replica's mirror needs."""
    parts = dict(parts, margin=MARGIN_BYTES)
    return sum(parts.values()), " + ".join("%s %s" % (name, _gib(n)) for name, n in parts.items())


def check_setting(parallel):
    """ValueError unless `parallel` is a parallel_quantization setting: off, auto or an int."""
    if isinstance(parallel, bool) or not (parallel in ("off", "auto") or isinstance(parallel, int)):
        raise ValueError("parallel_quantization must be 'off', 'auto' or an int, got %r" % (parallel,))


def resolve_plan(parallel, devices, iters, batch_size, home=None, free_bytes=None, mirror_parts=None,
                 home_is_accelerator=True, block_devices=None):
    """The Plan for AutoRound's `parallel_quantization` setting over `devices` (ints or
    device names), tuning for `iters` iterations with `batch_size` samples per step.

    home: the device the block lives on (devices[0] by default). free_bytes: {device: free
    bytes} for the memory guard (None: not checked); mirror_parts: {name: bytes} a mirror
    needs (the block's parameters, the tuning parameters, the activation working set).
    home_is_accelerator: False when the host runs on the CPU. block_devices: the devices
    holding the block's parameters (more than one: the host spread it, device_map)."""
    check_setting(parallel)
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1, got %d" % batch_size)
    devices = list(devices)
    home = devices[0] if home is None else home
    ordered = [home] + sorted((d for d in devices if d != home), key=device_index)
    if parallel == "off":
        return Plan(parallel, iters, batch_size, (home,), ("parallel_quantization is off: home alone",))

    blocking, left_out = [], []
    if not home_is_accelerator:
        blocking.append("home device %s is not an accelerator" % (home,))
    spread = sorted({str(d) for d in block_devices or ()})
    if len(spread) > 1:
        blocking.append("the block is spread over %s (device_map): each replica needs it whole" % ", ".join(spread))
    usable = [home]
    need, need_text = mirror_need(mirror_parts or {})
    for d in ordered[1:]:
        free = None if free_bytes is None else free_bytes.get(d)
        if free is not None and free < need:
            left_out.append("device %s: %s free, a mirror needs %s (%s)" % (d, _gib(free), _gib(need), need_text))
        else:
            usable.append(d)

    if parallel == "auto":
        if blocking:
            return Plan(parallel, iters, batch_size, (home,), tuple(blocking + left_out))
        world = power_of_two_at_most(len(usable)) if iters > 0 else len(usable)
        if len(ordered) < 2:
            left_out.append("only %d device visible: serial" % len(ordered))
        left_out += ["device %s: tuning (iters=%d) needs a power-of-two world, %d usable -> %d" % (
            d, iters, len(usable), world) for d in usable[world:]]
    else:
        reasons = list(blocking)
        if parallel > len(ordered):
            reasons.append("%d replicas asked, %d devices visible" % (parallel, len(ordered)))
        elif parallel > len(usable):
            reasons.append("%d replicas asked, %d devices have the memory for a mirror" % (parallel, len(usable)))
            reasons += left_out
        if parallel < 2:
            reasons.append("a data-parallel run needs at least 2 replicas, got %d" % parallel)
        if iters > 0 and parallel != power_of_two_at_most(parallel):
            reasons.append("tuning (iters=%d) needs a power-of-two world for halving-doubling, got %d" % (
                iters, parallel))
        if reasons:
            raise PlanRefused(parallel, reasons)
        world = parallel
        left_out += ["device %s: %d replicas asked" % (d, parallel) for d in usable[world:]]
    if iters > 0 and batch_size < world:
        demoted = power_of_two_at_most(batch_size)
        left_out += ["device %s: batch_size %d < %d replicas, demoted to %d (every replica needs a sample)" % (
            d, batch_size, world, demoted) for d in usable[demoted:world]]
        world = demoted
    return Plan(parallel, iters, batch_size, tuple(usable[:world]), tuple(left_out))
