"""The process settings a host's loop runs inside, each made by the first of nested or
concurrent holders and undone by the last: Python's cyclic collector with the older
objects frozen (AutoRound's gc.collect() between blocks then walks only what the run
made), a short interpreter switch interval (the main thread's operator launches do not
wait out other threads' Python for the GIL), and PyTorch's CUDA allocator making fixed
segments where the process asked for expandable ones (their growth inside the forwards'
allocations idles the GPU). None of them needs qlink's engine: the baselines apply them
alone (docs/HOSTS.md says what each buys)."""
import contextlib
import gc
import os
import sys
import threading
import warnings

import torch


class HeldSetting:
    """make(*args) -> state, by the first holder; reason(state) -> None where the setting is
    held, else why not, told to every holder; undo(state) when the last holder leaves."""

    def __init__(self, make, reason, undo):
        self._make, self._reason, self._undo = make, reason, undo
        self._lock = threading.Lock()
        self._depth = 0  # holders inside, over every thread
        self._state = None  # the first holder's make(), while _depth > 0

    @contextlib.contextmanager
    def held(self, *args):
        """Runs the body inside the setting; yields reason(state)."""
        with self._lock:
            if self._depth == 0:
                self._state = self._make(*args)
            self._depth += 1
            reason = self._reason(self._state)
        try:
            yield reason
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._undo(self._state)
                    self._state = None


# -- the cyclic garbage collector -------------------------------------------------------


def _freeze():
    """Whether the older objects are frozen by this holder (not where the collector is off)."""
    if gc.isenabled():
        gc.freeze()
        return True
    return False


def _unfreeze(frozen):
    # Every frozen object goes back to the collector, any frozen before the call too: left
    # frozen, a cycle among the model's objects could never be collected after the run.
    if frozen:
        gc.unfreeze()


_FROZEN = HeldSetting(_freeze, lambda frozen: None if frozen else "the collector is disabled", _unfreeze)


def frozen_gc():
    """Runs the body with the objects older than it frozen out of the cyclic collector;
    yields None when they are, else why not."""
    return _FROZEN.held()


# -- the interpreter's switch interval --------------------------------------------------


def check_interval(seconds):
    """seconds if it is None or a positive number of seconds, else ValueError naming it."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 1:
        raise ValueError("switch_interval must be None or seconds in (0, 1), got %r" % (seconds,))
    return float(seconds)


def _set_interval(seconds):
    # The interpreter keeps whole microseconds, truncating: 1e-4 would come back 99 us and
    # a restored interval one microsecond short of what it was.
    sys.setswitchinterval((round(seconds * 1e6) + 0.5) / 1e6)


def _shorten(seconds):
    before = sys.getswitchinterval()
    if seconds < before:
        _set_interval(seconds)
    return before, sys.getswitchinterval()


def _restore(saved):
    before, ours = saved
    if ours != before and sys.getswitchinterval() == ours:
        _set_interval(before)


def _why_not(saved):
    before, ours = saved
    return None if ours < before else "the interval is already %g s" % before


_SWITCH = HeldSetting(_shorten, _why_not, _restore)


def short_switch_interval(seconds):
    """Runs the body with sys.setswitchinterval(seconds) where the interval is longer;
    yields None when the interval is ours, else why not. The first of nested or concurrent
    calls sets it and the last restores the one before, unless something else has changed
    it since (then theirs stays)."""
    return _SWITCH.held(seconds)


# -- the CUDA allocator's segments -----------------------------------------------------

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


_SEGMENTS = HeldSetting(_turn_off, lambda turned: turned[1], _turn_back_on)


def fixed_segments():
    """Runs the body with expandable segments off where the allocator makes them; yields
    None when they are off by this call or an enclosing one, else why they were left alone.
    The first of nested or concurrent calls turns them off and the last turns them back on."""
    return _SEGMENTS.held()
