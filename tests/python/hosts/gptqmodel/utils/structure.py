"""Stand-in for gptqmodel.utils.structure: the lazy model fill. A checkpoint is safetensors
shards (read here by the stand-in's own `safe_open`, bound by name as GPTQModel binds
safetensors') and a weight map from checkpoint name to shard; LazyTurtle fills a shell
submodule's parameters from it on a device, reading each shard through a handle and copying
each tensor, without blocking only from page-locked sources when asked not to block."""
import json
import os

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "I64": torch.int64}


class _Shard:
    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        size = int.from_bytes(data[:8], "little")
        self._header, self._data = json.loads(data[8:8 + size]), data[8 + size:]

    def get_tensor(self, name):
        entry = self._header[name]
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(self._data[begin:end]), dtype=_DTYPES[entry["dtype"]])
        return flat.reshape(entry["shape"])  # a fresh tensor, as safetensors reads one

    def keys(self):
        return [name for name in self._header if name != "__metadata__"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def safe_open(path, framework="pt", device="cpu"):
    return _Shard(path)


def _get_qualified_name(root, obj):
    for name, module in root.named_modules():
        if module is obj:
            return name
    raise ValueError("module is not part of the model")


class LazyTurtle:
    def __init__(self, model_local_path, weight_map, checkpoint_prefix=""):
        self.model_local_path, self._weight_map = model_local_path, dict(weight_map)
        self._checkpoint_prefix = checkpoint_prefix  # a model whose checkpoint names differ from its modules'

    def _resolve_checkpoint_module_path(self, module_path):
        return self._checkpoint_prefix + module_path

    def materialize_submodule(self, *, target_model, target_submodule, device, non_blocking=False, module_path=None,
                              recurse=True, tie_weights=True, show_progress=True):
        if module_path is None:
            module_path = _get_qualified_name(target_model, target_submodule)
        prefix = self._resolve_checkpoint_module_path(module_path) + "."
        by_shard = {}
        for owner_name, owner in target_submodule.named_modules():
            for leaf, param in owner.named_parameters(recurse=False):
                full_name = prefix + (owner_name + "." if owner_name else "") + leaf
                by_shard.setdefault(self._weight_map[full_name], []).append((owner, leaf, full_name, param))
        with torch.no_grad():
            for shard, entries in by_shard.items():
                with safe_open(os.path.join(self.model_local_path, shard), framework="pt", device="cpu") as handle:
                    for owner, leaf, full_name, param in entries:
                        source = handle.get_tensor(full_name)
                        if param.is_meta or param.device != torch.device(device):
                            param = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device))
                            setattr(owner, leaf, param)
                        param.copy_(source, non_blocking=non_blocking and source.is_pinned())
        return target_submodule
