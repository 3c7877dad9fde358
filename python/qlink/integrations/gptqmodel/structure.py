"""GPTQModel's layer fills from the checkpoint (LazyTurtle.materialize_submodule), read
ahead: each fill of a numbered module ("model.layers.3"), once done, reads its next
sibling's tensors on a helper thread straight from the shard into page-locked buffers on a
GPU backend (no GIL held while it reads; a shard that is not safetensors, or a dtype
PyTorch lacks, goes through GPTQModel's own reader). The sibling's fill takes them through
the shard handles it opens (safe_open) and copies them without blocking on the caller's
stream; PyTorch keeps a page-locked block until the copies that read it are done.

GPTQModel fills each of a layer's linears again before replaying its forwards (the same
bytes): those fills (module_refill) take device-to-device copies of the layer's tensors
read ahead, uploaded once after the layer's fill and kept until the next layer's fill or
the loop's end, not where they would take more than a quarter of the device's free memory,
nor for a layer not read ahead (the first). Keeping page-locked buffers for them instead
would page-lock a second layer's worth, which stalls every thread's CUDA calls
(docs/HOSTS.md has what each step cost)."""
import concurrent.futures
import contextlib
import json
import os
import re
import threading

import torch

from ...streams import resolved_device
from ..patches import like

_NUMBERED = re.compile(r"^(.*\.)(\d+)$")
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_MAX_HEADER = 100 << 20  # safetensors' own limit on a header's size


def read_safetensors(path, names, pin):
    """{name: tensor} of those `names` the safetensors file at `path` holds in a dtype
    PyTorch has, each read from the file into its own (page-locked where pin) buffer;
    None where the file is not safetensors."""
    with open(path, "rb", buffering=0) as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < size <= _MAX_HEADER:
            return None
        try:
            header = json.loads(f.read(size))
        except ValueError:
            return None
        if not isinstance(header, dict):
            return None
        out = {}
        for name in names:
            entry = header.get(name)
            dtype = _DTYPES.get(entry.get("dtype")) if isinstance(entry, dict) else None
            if dtype is None:
                continue
            begin, end = entry["data_offsets"]
            buffer = torch.empty(end - begin, dtype=torch.uint8, pin_memory=pin)
            view, done = memoryview(buffer.numpy()), 0
            f.seek(8 + size + begin)
            while done < end - begin:
                count = f.readinto(view[done:])
                if not count:
                    raise OSError("%s: %s ends %d bytes short" % (path, name, end - begin - done))
                done += count
            out[name] = buffer.view(dtype).view(entry["shape"])
        return out


KEEP_SHARE = 4  # a layer's kept copies take at most 1 / KEEP_SHARE of its device's free memory
_IN_LAYER = "a module of the layer filled last"  # a fill the layer's kept copies serve


class _Copies:
    """The layer's tensors on its device, handed out as fresh copies: each of its modules'
    fills takes them, and a fill may keep what it is handed (a buffer registered as
    given). A copy is made on the caller's current stream once the upload is done there."""

    def __init__(self, tensors, device, uploaded):
        self._tensors, self.device, self._uploaded = tensors, device, uploaded

    def get(self, key):
        tensor = self._tensors.get(key)
        if tensor is None:
            return None
        if self._uploaded is not None:
            stream = torch.cuda.current_stream(tensor.device)
            self._uploaded.wait(stream)
            tensor.record_stream(stream)  # not reused by the allocator before this stream's copy is done
        return tensor.clone()


class _Ready(threading.local):
    """The read-ahead tensors the current thread's fill may take, by (shard path, name)."""
    tensors = None


class _Handle:
    """A shard handle that answers get_tensor from the read-ahead tensors first."""

    def __init__(self, handle, path, ready):
        self._handle, self._path, self._ready = handle, path, ready

    def get_tensor(self, name):
        tensor = self._ready.get((self._path, name))
        return self._handle.get_tensor(name) if tensor is None else tensor

    def __getattr__(self, name):
        return getattr(self._handle, name)


class LayerPrefetch:
    """One installation's read-ahead: one layer at a time in CPU memory, read by one
    helper thread."""

    def __init__(self, safe_open, pin, counters, guard, patch="layer_prefetch", refill="module_refill"):
        self._safe_open, self._pin = safe_open, pin
        self.counters, self.guard, self.patch, self.refill = counters, guard, patch, refill
        self._ready = _Ready()
        self._lock = threading.Lock()
        self._pending = None  # (turtle, numbered module path, future of {(shard path, name): tensor})
        self._layer = None  # the numbered module filled last: its own numbered modules are no layers
        self._kept = (None, "the layer was not read ahead")  # its tensors for its modules' fills: (_Copies, why not)
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qlink-prefetch")

    def close(self):
        with self._lock:
            self._pending = None
            self._kept = (None, "closed")
        self._reader.shutdown(wait=True)

    def forget(self):
        """Drops the last layer's kept copies (its GPU memory goes back to the allocator): the
        loop that filled it has returned."""
        with self._lock:
            self._kept = (None, "the loop that filled the layer returned")

    def drop_kept(self, modules):
        """Drops the kept copies of the tensors of `modules` (paths inside the layer filled
        last, as its subsets name them): a stage that owns them makes no second fill of them,
        so their memory goes back to the allocator (a DeepSeek-V3 layer's experts: 22 GB).
        Returns how many tensors it dropped."""
        owned = set(modules)
        depths = {m.count(".") + 1 for m in owned}
        with self._lock:
            copies = self._kept[0]
            if copies is None or not owned:
                return 0
            drop = [key for key in copies._tensors
                    if any(".".join(key[1].split(".")[:-1][-d:]) in owned for d in depths)]
            for key in drop:
                del copies._tensors[key]
        return len(drop)

    def make_safe_open(self):
        original = self._safe_open

        @contextlib.contextmanager
        def safe_open(path, *args, **kwargs):
            with original(path, *args, **kwargs) as handle:
                ready = self._ready.tensors
                yield handle if ready is None else _Handle(handle, path, ready)
        return safe_open

    def make_materialize_submodule(self, original, qualified_name):
        @like(original)
        def materialize_submodule(turtle, *, target_model, target_submodule, device, non_blocking=False,
                                  module_path=None, **kwargs):
            path = module_path if module_path is not None else qualified_name(target_model, target_submodule)
            layer, why = self._layer_of(path)
            tensors = self._read_ahead(turtle, path) if layer else self._kept_for(why, device)
            if tensors is None:
                module = original(turtle, target_model=target_model, target_submodule=target_submodule,
                                  device=device, non_blocking=non_blocking, module_path=path, **kwargs)
            else:
                self._ready.tensors = tensors
                try:  # what the fill raises is the host's own (it may have filled part of the module)
                    module = original(turtle, target_model=target_model, target_submodule=target_submodule,
                                      device=device, non_blocking=True, module_path=path, **kwargs)
                finally:
                    self._ready.tensors = None
            if layer:
                try:
                    self._keep(tensors, device)
                except Exception as error:  # noqa: BLE001 (qlink's copies: the modules' fills read for themselves)
                    self.guard.fallback(self.refill, error)
                try:  # after the fill: the helper's reads do not compete with its copies
                    self._read_next(turtle, path)
                except Exception as error:  # noqa: BLE001 (qlink's read-ahead: the next fill reads for itself)
                    self.guard.fallback(self.patch, error)
            return module
        return materialize_submodule

    def _read_ahead(self, turtle, path):
        """The layer's tensors read ahead, or None (counted: nothing read ahead, or the read
        failed and the host reads)."""
        read = self._take(turtle, path)
        if read is None:
            self.counters.host(self.patch, "nothing read ahead")
            return None
        try:
            tensors = read.result()
        except Exception as error:  # noqa: BLE001 (qlink's read failed: nothing of the host's ran)
            self.guard.fallback(self.patch, error)
            return None
        self.counters.qlink(self.patch)
        return tensors

    def _kept_for(self, why, device):
        """The kept copies for a fill that is not a layer's (why) to `device`, or None
        (counted): a fill to another device reads for itself (a copy from the layer's GPU to
        the host would wait for that GPU)."""
        if why != _IN_LAYER:
            self.counters.host(self.patch, why)
            return None
        with self._lock:
            copies, reason = self._kept
        device = resolved_device(device)  # GPTQModel fills a layer to "cuda" and its modules to "cuda:0"
        if copies is not None and device != copies.device:
            copies, reason = None, "a fill to %s, not the layer's %s" % (device, copies.device)
        self.counters.record(self.refill, reason)
        return copies

    def _keep(self, tensors, device):
        """The filled layer's tensors read ahead, copied to its device for its modules' fills
        in place of the layer before's."""
        with self._lock:
            self._kept = (None, "the layer was not read ahead")  # the layer before's dropped first
        if tensors is None:
            return
        device = resolved_device(device)
        if device.type != "cuda":  # on the host, the tensors read ahead themselves
            kept = (_Copies(tensors, device, None), None)
        elif sum(t.numel() * t.element_size() for t in tensors.values()) * KEEP_SHARE > \
                torch.cuda.mem_get_info(device)[0]:
            kept = (None, "the layer would take more than 1/%d of the device's free memory" % KEEP_SHARE)
        else:
            on_device = {key: t.to(device, non_blocking=True) for key, t in tensors.items()}
            uploaded = torch.cuda.Event()
            uploaded.record(torch.cuda.current_stream(device))
            kept = (_Copies(on_device, device, uploaded), None)
        with self._lock:
            self._kept = kept

    def _layer_of(self, path):
        """(whether `path` is a layer: a numbered module not inside the layer filled last, why
        not); a layer becomes the one filled last."""
        with self._lock:
            if self._layer is not None and (path or "").startswith(self._layer + "."):
                return False, _IN_LAYER
            if _NUMBERED.match(path or "") is None:
                return False, "not a numbered module"
            self._layer = path
            return True, None

    def _take(self, turtle, path):
        """The future of `path`'s read-ahead, if it is the one in flight (taken)."""
        with self._lock:
            pending = self._pending
            if pending is None or pending[0] is not turtle or pending[1] != path:
                return None
            self._pending = None
            return pending[2]

    def _read_next(self, turtle, path):
        """Starts reading the numbered sibling after `path` where the checkpoint has it, in
        place of any read-ahead not taken."""
        match = _NUMBERED.match(path)
        sibling = "%s%d" % (match.group(1), int(match.group(2)) + 1)
        names = self._names(turtle, sibling)
        with self._lock:
            self._pending = (turtle, sibling, self._reader.submit(self._read, names)) if names else None

    @staticmethod
    def _names(turtle, module):
        """{shard path: [checkpoint names]} of `module`'s tensors."""
        prefix = turtle._resolve_checkpoint_module_path(module) + "."
        names = {}
        for name, shard in turtle._weight_map.items():
            if name.startswith(prefix):
                names.setdefault(os.path.join(turtle.model_local_path, shard), []).append(name)
        return names

    def _read(self, names):
        """{(shard path, name): tensor} of every name, page-locked where pinning."""
        out = {}
        for path, shard_names in names.items():
            found = read_safetensors(path, shard_names, self._pin) or {}
            rest = [name for name in shard_names if name not in found]
            if rest:
                with self._safe_open(path, framework="pt", device="cpu") as handle:
                    for name in rest:
                        tensor = handle.get_tensor(name)
                        found[name] = torch.empty_like(tensor, pin_memory=True).copy_(tensor) if self._pin else tensor
            out.update(((path, name), tensor) for name, tensor in found.items())
        return out
