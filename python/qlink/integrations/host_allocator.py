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
it; the segments already made stay as they are.

PyTorch's run-time setter parses a whole settings string and puts every option the string
leaves out back to its default (max_split_size_mb, garbage_collection_threshold,
roundup_power2_divisions): so the strings given to it here are the allocator's own last
settings with expandable_segments alone changed, and the loop runs, and GPTQModel goes on
after it, with the rest of what it asked for."""
import os
import warnings

import torch

from .held_setting import HeldSetting

_KEY = "expandable_segments"


def _config(environ):
    """The process's allocator config: PyTorch's PYTORCH_ALLOC_CONF, or where unset, its
    older name PYTORCH_CUDA_ALLOC_CONF."""
    return environ.get("PYTORCH_ALLOC_CONF") or environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""


def _items(config):
    """The options of a settings string, split at its top-level commas (a bracketed value,
    roundup_power2_divisions:[256:1,>:2], stays one), blanks dropped."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(config + ","):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if c == "," and depth == 0:
            items.append(config[start:i].replace(" ", ""))
            start = i + 1
    return [item for item in items if item]


def with_option(config, key, value):
    """`config` with option `key` set to `value` (in its place, else last), every other
    option as it was."""
    items = _items(config)
    setting = "%s:%s" % (key, value)
    keys = [item.split(":", 1)[0] for item in items]
    if key in keys:
        items[keys.index(key)] = setting
    else:
        items.append(setting)
    return ",".join(items)


def asked_for_expandable(environ=os.environ):
    """Whether the process's allocator config asks for expandable segments."""
    options = dict(item.split(":", 1) for item in _items(_config(environ)) if ":" in item)
    return options.get(_KEY) == "True"


def _snapshot_settings():
    """The CUDA allocator's settings as its memory snapshot reports them ({} where this
    torch reports none)."""
    snapshot = getattr(torch.cuda.memory, "_snapshot", None)
    if snapshot is None:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return snapshot().get("allocator_settings") or {}
    except RuntimeError:
        return {}


def _expandable(settings):
    """Whether the allocator whose snapshot settings these are makes expandable segments: as
    they report (a process whose allocator started before GPTQModel set the variable has
    fixed ones whatever the variable says), else as the process's config asks."""
    return bool(settings[_KEY]) if _KEY in settings else asked_for_expandable()


def _settings_string(settings):
    """The settings string the allocator whose snapshot settings these are last parsed, else
    the process's config."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if isinstance(settings.get(name), str):
            return settings[name]
    return _config(os.environ)


def expandable_now():
    """Whether the CUDA allocator makes expandable segments now."""
    return _expandable(_snapshot_settings())


def _has_cuda():
    return torch.cuda.is_available()


def _setter():
    """PyTorch's run-time allocator setting, or None where this torch has none."""
    return getattr(torch.cuda.memory, "_set_allocator_settings", None)


def _turn_off():
    """(whether expandable segments were turned off, why not where they were not, the
    settings string before)."""
    if not _has_cuda():
        return False, "no CUDA device, no CUDA allocator", None
    settings = _snapshot_settings()  # one snapshot: it walks every segment
    if not _expandable(settings):
        return False, "the allocator makes fixed segments already", None
    setter = _setter()
    if setter is None:
        return False, "this torch cannot change its CUDA allocator's settings at run time", None
    before = _settings_string(settings)
    try:
        setter(with_option(before, _KEY, "False"))
    except RuntimeError as error:  # a torch whose parser does not take the key
        return False, "PyTorch refused %s:False: %s" % (_KEY, str(error).splitlines()[0]), None
    return True, None, before


def _turn_back_on(turned):
    if turned[0]:
        _setter()(with_option(turned[2], _KEY, "True"))


_HELD = HeldSetting(_turn_off, lambda turned: turned[1], _turn_back_on)


def fixed_segments():
    """Runs the body with expandable segments off where the allocator makes them; yields
    None when they are off by this call or an enclosing one, else why they were left alone.
    The first of nested or concurrent calls turns them off and the last turns them back on."""
    return _HELD.held()
