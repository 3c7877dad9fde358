"""The Context's device and peer-topology calls (GPTQModel's enable_peer_access,
enable_for_devices, PeerStatus, peer_matrix, can_copy)."""
import ctypes
import dataclasses
import sys

from . import _abi


@dataclasses.dataclass(frozen=True)
class PeerStatus:
    src: int
    dst: int
    state: str           # one of _abi.PEER_STATES
    probed: bool
    peer_gbps: float
    regular_gbps: float
    reason: str

    @property
    def enabled(self):
        return self.state == "enabled"


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int


def accelerator_index(device):
    """The GPU index a device names (an int, "cuda:1", a torch.device), or None for a host
    device: P2P is an accelerator concept, CPU memory takes the regular path."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    text = str(device)
    if text == "cpu" or text.startswith("cpu:"):
        return None
    kind, _, index = text.partition(":")
    if kind != "cuda":
        raise ValueError("device %r is neither a GPU nor the host" % (device,))
    if index:
        return int(index)
    torch = sys.modules.get("torch")
    return torch.cuda.current_device() if torch is not None else 0


def _grant_torch_segments(pairs):
    """Lets each enabled pair's reader map PyTorch's memory of the other device.

    Peer access enabled through the runtime does not reach memory PyTorch's caching
    allocator maps itself (expandable_segments: cuMemCreate + cuMemMap): a kernel reading
    it over the link faults. PyTorch grants a device its peer's segments the first time
    it copies between the two, so a tiny copy each way per pair does it."""
    torch = sys.modules.get("torch")
    if torch is None or not pairs or not torch.cuda.is_available():
        return
    for a, b in {tuple(sorted(p)) for p in pairs}:
        if max(a, b) < torch.cuda.device_count():
            x, y = torch.empty(1, device="cuda:%d" % a), torch.empty(1, device="cuda:%d" % b)
            x.copy_(y)
            y.copy_(x)


class PeerCalls:
    """Devices and their peer links; part of Context."""

    def devices(self):
        out = []
        for d in range(self.device_count):
            info = _abi.DeviceInfo(struct_size=ctypes.sizeof(_abi.DeviceInfo))
            self.invoke("device_info", d, ctypes.byref(info))
            out.append(DeviceInfo(d, info.name.decode(), info.total_bytes, info.free_bytes))
        return out

    def enable_peer_access(self, devices=None):
        """Enables (and per config probes) every ordered pair of `devices` (device indices,
        all by default); returns the peer matrix of those devices."""
        devices = list(range(self.device_count)) if devices is None else [int(d) for d in devices]
        array = (ctypes.c_int32 * max(len(devices), 1))(*devices)
        self.invoke("enable_peer_access", array, len(devices))
        matrix = self.peer_matrix(devices)
        _grant_torch_segments([(s, d) for (s, d), st in matrix.items() if st.enabled])
        return matrix

    def enable_for_devices(self, devices):
        """enable_peer_access for the GPUs among `devices` (torch devices, "cuda:N" or
        indices); host devices are skipped, and fewer than two GPUs is a no-op: no pairs, no
        warning."""
        gpus = sorted({i for i in map(accelerator_index, devices) if i is not None})
        return self.enable_peer_access(gpus) if len(gpus) > 1 else {}

    def peer_info(self, src, dst):
        info = _abi.PeerInfo(struct_size=ctypes.sizeof(_abi.PeerInfo))
        self.invoke("peer_info", int(src), int(dst), ctypes.byref(info))
        return PeerStatus(info.src_device, info.dst_device, _abi.PEER_STATES[info.state], bool(info.probed),
                          info.peer_gbps, info.regular_gbps, info.reason.decode())

    def peer_matrix(self, devices=None):
        devices = range(self.device_count) if devices is None else [int(d) for d in devices]
        return {(s, d): self.peer_info(s, d) for s in devices for d in devices if s != d}

    def can_copy(self, src, dst):
        """Whether src -> dst takes the direct peer path (a host device never does)."""
        s, d = accelerator_index(src), accelerator_index(dst)
        return s is not None and d is not None and s != d and self.peer_info(s, d).enabled

    def measure_link(self, src, dst, nbytes=32 << 20):
        m = _abi.LinkMeasurement(struct_size=ctypes.sizeof(_abi.LinkMeasurement))
        self.invoke("measure_link", int(src), int(dst), int(nbytes), ctypes.byref(m))
        return {"bytes": m.bytes, "gbps": m.gbps, "latency_us": m.latency_us, "used_peer": bool(m.used_peer)}
