"""The next numbered layer's checkpoint tensors read ahead of GPTQModel's loop.

GPTQModel builds its model as an empty shell and fills each decoder layer from the
checkpoint when its loop reaches it (LazyTurtle.materialize_submodule): the main thread
reads every tensor of the layer from its safetensors shard into pageable memory and copies
it to the GPU, each copy blocking, while the GPU waits (about 0.2 s a LLaMA-7B layer on an
H200, a fifth of the loop's idle time). Here each materialization of a numbered module
("model.layers.3") starts reading its next sibling's tensors ("model.layers.4") on a helper
thread, into page-locked memory where a GPU backend will take them; the sibling's own
materialization then finds them ready (the module's `safe_open` hands them out by shard and
name) and copies them without blocking, on the caller's current stream, as GPTQModel copies
any page-locked source when asked not to block. PyTorch keeps a page-locked block from
reuse until the copies that read it have completed, so the buffers can go as soon as the
materialization returns. Tensors no call asked for are dropped with the read-ahead."""
import concurrent.futures
import contextlib
import os
import re
import threading

import torch

from .patches import like

_NUMBERED = re.compile(r"^(.*\.)(\d+)$")


class _Ready(threading.local):
    """The read-ahead tensors the current thread's materialization may take, by (shard
    path, checkpoint name)."""
    tensors = None


class _Handle:
    """A shard handle that answers get_tensor from the read-ahead tensors first."""

    def __init__(self, handle, path, ready):
        self._handle, self._path, self._ready = handle, path, ready

    def get_tensor(self, name):
        tensor = self._ready.pop((self._path, name), None) if self._ready else None
        return self._handle.get_tensor(name) if tensor is None else tensor

    def __getattr__(self, name):
        return getattr(self._handle, name)


class LayerPrefetch:
    """One installation's read-ahead: at most one sibling in flight (a layer's tensors in
    host memory), read by one helper thread."""

    def __init__(self, safe_open, pin, counters, guard, patch="layer_prefetch"):
        self._safe_open, self._pin = safe_open, pin
        self.counters, self.guard, self.patch = counters, guard, patch
        self._ready = _Ready()
        self._lock = threading.Lock()
        self._pending = None  # (turtle, module path, future of {(shard path, name): tensor})
        self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qlink-prefetch")

    def close(self):
        with self._lock:
            self._pending = None
        self._reader.shutdown(wait=True)

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
            ahead = self._take(turtle, path)
            try:
                self._read_next(turtle, path)
            except Exception as error:  # noqa: BLE001 (qlink's read-ahead: the host's fill below runs alone)
                self.guard.fallback(self.patch, error)

            def host():
                return original(turtle, target_model=target_model, target_submodule=target_submodule, device=device,
                                non_blocking=non_blocking, module_path=module_path, **kwargs)

            if ahead is None:
                self.counters.host(self.patch, "nothing read ahead" if _NUMBERED.match(path or "")
                                   else "not a numbered module")
                return host()
            try:
                tensors = ahead.result()
            except Exception as error:  # noqa: BLE001 (the helper's read failed: nothing of the host's ran)
                self.guard.fallback(self.patch, error)
                return host()
            self._ready.tensors = tensors
            try:  # a failure now is the host's own (it may have filled part of the module)
                module = original(turtle, target_model=target_model, target_submodule=target_submodule,
                                  device=device, non_blocking=True, module_path=module_path, **kwargs)
            finally:
                self._ready.tensors = None
            self.counters.qlink(self.patch)
            return module
        return materialize_submodule

    def _take(self, turtle, path):
        """The future of `path`'s read-ahead, if it is the one in flight (taken)."""
        with self._lock:
            pending = self._pending
            if pending is None or pending[0] is not turtle or pending[1] != path:
                return None
            self._pending = None
            return pending[2]

    def _read_next(self, turtle, path):
        """Starts reading the numbered sibling after `path` where the checkpoint has it
        (replacing any read-ahead not taken)."""
        match = _NUMBERED.match(path or "")
        if match is None:
            return
        sibling = "%s%d" % (match.group(1), int(match.group(2)) + 1)
        prefix = turtle._resolve_checkpoint_module_path(sibling) + "."
        names = {}
        for name, shard in turtle._weight_map.items():
            if name.startswith(prefix):
                names.setdefault(os.path.join(turtle.model_local_path, shard), []).append(name)
        with self._lock:
            self._pending = (turtle, sibling, self._reader.submit(self._read, names)) if names else None

    def _read(self, names):
        """{(shard path, name): tensor} of every name, page-locked where pinning."""
        out = {}
        for path, shard_names in names.items():
            with self._safe_open(path, framework="pt", device="cpu") as handle:
                for name in shard_names:
                    tensor = handle.get_tensor(name)
                    if self._pin:
                        tensor = torch.empty_like(tensor, pin_memory=True).copy_(tensor)
                    out[(path, name)] = tensor
        return out
