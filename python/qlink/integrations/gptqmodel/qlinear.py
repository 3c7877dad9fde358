"""GPTQModel's packing of a finished layer into int32 words through qlink.quant.gptq_pack.

GPTQModel's finalizers call pack_block, which imports its native packer at each call
(pack_block_ext.pack_block_cpu, a torch extension built where a compiler is) and packs in
Python, 32 input columns at a time under the layer's lock, when that raises. qlink takes
the packer's slot: the same words, bit for bit, on the GPU (on the CPU without one), or the
words made when the layer was solved (pack_ahead), where its inputs are the solve's. The
host's path is the slot's original (absent, it raises, and pack_block packs in Python).
pack_block swallows what its packer raises, so under strict the refusal is carried past
it and raised, naming the layer, once pack_block returns."""
import threading

import torch

from ...quant.pack import gptq_pack
from ..patches import FallbackRefused, like

PATCH = "pack"


# The layer being packed is known to pack_block alone: it leaves the layer's name here, on
# the finalizer thread, for its packer's slot, which leaves a refusal for pack_block to raise.
_call = threading.local()


def make_pack_block_cpu(installation, original):
    """pack_block_ext.pack_block_cpu, the native packer's slot, through gptq_pack."""
    counters, guard = installation.counters, installation.guard

    @like(original)
    def pack_block_cpu(weight, scales, zeros, g_idx, bits, word_bits, block_in, threads):
        if word_bits != 32:
            counters.host(PATCH, "%d-bit words" % word_bits)
            return original(weight, scales, zeros, g_idx, bits, word_bits, block_in, threads)
        # The finalizer thread's GPU where there is one (its words come back to the host).
        name = getattr(_call, "name", None)
        words = installation.packs.take(name, weight, scales, zeros, g_idx, bits) if name else None
        if words is not None:
            counters.qlink(PATCH)
            return words
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        try:
            return guard.attempt(PATCH, lambda: gptq_pack(weight, scales, zeros, g_idx, bits, device=device),
                                 lambda: original(weight, scales, zeros, g_idx, bits, word_bits, block_in, threads))
        except FallbackRefused as error:
            _call.error = error
            raise
    return pack_block_cpu


def make_pack_block(installation, original):
    """PackableQuantLinear.pack_block raising, under strict, what its packer's slot refused."""
    @like(original)
    def pack_block(module, *args, **kwargs):
        _call.error, _call.name = None, getattr(module, "name", None)
        try:
            result = original(module, *args, **kwargs)
        finally:
            _call.name = None
        error, _call.error = _call.error, None
        if error is not None:  # named here: the packer's slot is not told the layer
            raise FallbackRefused("%s: %s" % (getattr(module, "name", None) or type(module).__name__, error)) \
                from error
        return result
    return pack_block
