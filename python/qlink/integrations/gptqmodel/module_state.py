"""What the kept layer outputs compare between a layer's forwards (attention_outputs.py,
tail_inputs.py): tensors by address, shape and layout, a key good only while those tensors
live (a dead tensor's address may be another's); modules by identity and their tensors by
identity, address and version; the hooks on a module but qlink's own."""
import itertools
import weakref

import torch


def tensor_keys(tensors):
    return tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in tensors)


def tensor_refs(tensors):
    """Weak references of the tensors a key was made from (alive() says whether it holds)."""
    return tuple(weakref.ref(t) for t in tensors)


def alive(refs):
    """Whether every tensor of tensor_refs() still lives: their addresses are still theirs."""
    return all(r() is not None for r in refs)


def kept_answers(kept_signature, kept_refs, signature):
    """Whether a result kept for a call's key answers this call: kept under the same
    signature, and the tensors its key was made from still alive."""
    return kept_signature == signature and alive(kept_refs)


def _version(t):
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version: its address and identity stand
        return None


def signature(modules, recurse, skip=()):
    """Each module's identity and its parameters' and buffers' (identity, address, version),
    but those of the modules in `skip` (and their own)."""
    skipped = {id(t) for m in skip for t in itertools.chain(m.parameters(), m.buffers())}
    return tuple((id(m),) + tuple((id(t), t.data_ptr(), _version(t))
                                  for t in itertools.chain(m.parameters(recurse=recurse), m.buffers(recurse=recurse))
                                  if id(t) not in skipped)
                 for m in modules if all(m is not s for s in skip))


def plain(value):
    """Whether `value` is tensors and plain values only (nothing that holds state of its
    own, as a key-value cache does)."""
    if isinstance(value, (torch.Tensor, bool, int, float, str, type(None))):
        return True
    if isinstance(value, (tuple, list)):
        return all(map(plain, value))
    if isinstance(value, dict):
        return all(map(plain, value.values()))
    return False


class OwnHook:
    """A hook of qlink's own on a host module: hooked() passes it by, and a copy of the
    module shares it (the copy's calls are never an attached layer's)."""

    def __deepcopy__(self, memo):
        return self


def hooked(module):
    """Whether a hook other than qlink's own is on `module` or in it (torch's, or GPTQModel's
    forward_hook of a subset being calibrated)."""
    for m in module.modules():
        if getattr(m, "forward_hook", None):
            return True
        for hooks in (m._forward_hooks, m._forward_pre_hooks):
            if any(not isinstance(h, OwnHook) for h in hooks.values()):
                return True
    return False
