"""A host's loop run with PyTorch's CUDA caching allocator making fixed segments where it
made expandable ones, expandable segments back when the outermost such loop returns.

GPTQModel asks for expandable segments as it is imported (PYTORCH_ALLOC_CONF, where unset,
for memory saving). Measured on one H200 with qlink installed, GPTQModel's 4-layer loop on
LLaMA-7B-sized layers: with them, the loop thread's allocations took 0.32 ms a call
(aten::empty_strided; aten::silu 2.5 ms, its output's allocation inside) in driver calls
torch.profiler does not trace, and left the GPU idle about 1.4 s of the 8.8 s loop; without
them the run took 8.7 s against 11.0 s, the GPU busy 71.7 % of the loop against 56.6 %, the
peak memory 7.4 GiB against 8.5 GiB, every solve's digest equal. PyTorch reads the setting
when it makes a segment, so a change made mid-process applies to the segments made after
it; the segments already made stay as they are."""
import os
import warnings

import torch

from .held_setting import HeldSetting

_KEY = "expandable_segments"


def asked_for_expandable(environ=os.environ):
    """Whether the process's allocator config asks for expandable segments: PyTorch's
    PYTORCH_ALLOC_CONF, or where unset, its older name PYTORCH_CUDA_ALLOC_CONF."""
    config = environ.get("PYTORCH_ALLOC_CONF") or environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    options = dict(item.split(":", 1) for item in config.replace(" ", "").split(",") if ":" in item)
    return options.get(_KEY) == "True"


def _reported():
    """Whether the CUDA allocator makes expandable segments, as its memory snapshot's
    settings report it; None where this torch reports no such setting."""
    snapshot = getattr(torch.cuda.memory, "_snapshot", None)
    if snapshot is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            settings = snapshot().get("allocator_settings") or {}
    except RuntimeError:
        return None
    return bool(settings[_KEY]) if _KEY in settings else None


def expandable_now():
    """Whether the CUDA allocator makes expandable segments now: as it reports (a process
    whose allocator started before GPTQModel set the variable has fixed ones whatever the
    variable says), else as the process's config asks."""
    reported = _reported()
    return asked_for_expandable() if reported is None else reported


def _has_cuda():
    return torch.cuda.is_available()


def _setter():
    """PyTorch's run-time allocator setting, or None where this torch has none."""
    return getattr(torch.cuda.memory, "_set_allocator_settings", None)


def _turn_off():
    """(whether expandable segments were turned off, why not where they were not)."""
    if not _has_cuda():
        return False, "no CUDA device, no CUDA allocator"
    if not expandable_now():
        return False, "the allocator makes fixed segments already"
    setter = _setter()
    if setter is None:
        return False, "this torch cannot change its CUDA allocator's settings at run time"
    try:
        setter(_KEY + ":False")
    except RuntimeError as error:  # a torch whose parser does not take the key
        return False, "PyTorch refused %s:False: %s" % (_KEY, str(error).splitlines()[0])
    return True, None


def _turn_back_on(turned):
    if turned[0]:
        _setter()(_KEY + ":True")


_HELD = HeldSetting(_turn_off, lambda turned: turned[1], _turn_back_on)


def fixed_segments():
    """Runs the body with expandable segments off where the allocator makes them; yields
    None when they are off by this call or an enclosing one, else why they were left alone.
    The first of nested or concurrent calls turns them off and the last turns them back on."""
    return _HELD.held()
