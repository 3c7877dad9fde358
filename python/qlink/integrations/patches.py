"""What an integration changes in its host, and what ran through it.

Rebindings: a host function replaced in the module that defines it, in every loaded host
module that imported it by name, and wherever it was bound as a default argument when a
function or method was defined; undone in reverse order by undo().

Counters, per patch: "qlink" (the call ran through qlink), "host" (the host's own code
ran by design: CPU memory, options qlink does not cover; the reason is counted) and
"fallback" (qlink's path failed before changing anything the host can see, and the
host's ran instead; with strict=True that raises FallbackRefused instead). The host's own
errors, raised by its callbacks on qlink's path, propagate as they are (Guard.attempt)."""
import collections
import functools
import inspect
import sys
import threading


def like(original):
    """functools.wraps without __module__: the replacement is qlink's, not the host's."""
    return functools.wraps(original, assigned=("__name__", "__qualname__", "__doc__"))


def eager(fn):
    """fn run as plain Python where torch.compile traces its caller (a graph break there, so
    its checks read attributes as Python does: under Dynamo a function's __name__ read as a
    class descriptor, and a seam's counters and fallbacks would run only while tracing);
    fn itself where PyTorch has no torch.compiler."""
    import torch  # here only: the rest of this module needs no torch
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


class FallbackRefused(RuntimeError):
    """strict=True: a patch whose qlink path failed would have fallen back to the host."""


class Counters:
    """Thread-safe per-patch counts of what ran."""

    def __init__(self, patches):
        self._lock = threading.Lock()
        self._counts = {name: {"qlink": 0, "host": 0, "fallback": 0, "reasons": collections.Counter()}
                        for name in patches}

    def qlink(self, patch):
        with self._lock:
            self._counts[patch]["qlink"] += 1

    def host(self, patch, reason):
        with self._lock:
            self._counts[patch]["host"] += 1
            self._counts[patch]["reasons"][reason] += 1

    def record(self, patch, reason):
        """qlink(patch) where reason is None (or empty), else host(patch, reason)."""
        if reason:
            self.host(patch, reason)
        else:
            self.qlink(patch)

    def fallback(self, patch, reason):
        with self._lock:
            self._counts[patch]["fallback"] += 1
            self._counts[patch]["reasons"][reason] += 1

    def snapshot(self):
        """{patch: {"qlink": n, "host": n, "fallback": n, "reasons": {reason: n}}}"""
        with self._lock:
            return {name: dict(c, reasons=dict(c["reasons"])) for name, c in self._counts.items()}


class Guard:
    """The qlink-or-host decision of one installation: counts, and raises instead of
    falling back when strict."""

    def __init__(self, counters, strict):
        self.counters, self.strict = counters, strict

    def fallback(self, patch, error):
        """Records that `patch`'s qlink path failed with `error`; raises under strict."""
        reason = "%s: %s" % (type(error).__name__, error)
        if self.strict:
            raise FallbackRefused("qlink's %s failed and strict=True forbids the host's fallback: %s" % (
                patch, reason)) from error
        self.counters.fallback(patch, reason)

    def attempt(self, patch, through_qlink, host, commit=None):
        """One call the qlink way, or the host's way when qlink fails before the host saw
        anything.

        through_qlink(): qlink's work, changing nothing the host can see (new tensors,
        new modules). If it raises, host() runs in its place, once, counted as a fallback
        (FallbackRefused instead under strict), after the error and its frames, and so what
        qlink's attempt held, are released. commit(result), when given, then makes
        the result the host's (it may call the host's callbacks). What host() or commit()
        raises propagates as it is: the host's own errors are no qlink failure, and a
        fallback after the host's state changed would run the host's code twice."""
        try:
            result = through_qlink()
        except Exception as error:  # noqa: BLE001 (qlink's own failure: nothing of the host's ran)
            self.fallback(patch, error)
            failed = True
        else:
            failed = False
        if failed:  # out of the except block: the error's frames (qlink's memory) are gone first
            return host()
        if commit is not None:
            result = commit(result)
        self.counters.qlink(patch)
        return result


def _functions_of(module):
    """The plain functions and the methods of classes defined in `module`."""
    for value in list(vars(module).values()):
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            yield value
        elif inspect.isclass(value) and value.__module__ == module.__name__:
            for member in list(vars(value).values()):
                member = getattr(member, "__func__", member)  # staticmethod, classmethod
                if inspect.isfunction(member):
                    yield member


def _label(owner, name):
    return "%s.%s" % (getattr(owner, "__qualname__", None) or owner.__name__, name)


class Rebindings:
    """Every change made to host modules, so it can be undone exactly where it is still
    qlink's."""

    def __init__(self):
        self._undo = []  # (label, is it still ours?, restore), in the order they were made

    def set(self, owner, name, value):
        """owner.name = value (a module or class attribute)."""
        old = vars(owner)[name]
        setattr(owner, name, value)
        self._undo.append((_label(owner, name), lambda: vars(owner).get(name) is value,
                           lambda: setattr(owner, name, old)))

    def entry(self, mapping, key, value, label):
        """mapping[key] = value (a registry's entry, such as transformers' experts functions)."""
        old = mapping[key]
        mapping[key] = value
        self._undo.append((label, lambda: mapping.get(key) is value, lambda: mapping.__setitem__(key, old)))

    def everywhere(self, original, replacement, package):
        """`original` replaced by `replacement` in every loaded module of `package` (the
        defining one and each that imported it by name) and in every default argument of
        their functions and methods that holds it. Returns how many bindings changed."""
        changed = 0
        prefix = package + "."
        for name, module in list(sys.modules.items()):
            if module is None or not (name == package or name.startswith(prefix)):
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    self.set(module, attr, replacement)
                    changed += 1
            for fn in _functions_of(module):
                changed += self._defaults(fn, original, replacement)
        return changed

    def _defaults(self, fn, original, replacement):
        changed = 0
        label = fn.__module__ + "." + fn.__qualname__
        if fn.__defaults__ and any(d is original for d in fn.__defaults__):
            old = fn.__defaults__
            new = fn.__defaults__ = tuple(replacement if d is original else d for d in old)
            self._undo.append((label + " (defaults)", lambda: fn.__defaults__ is new,
                               lambda: setattr(fn, "__defaults__", old)))
            changed += 1
        if fn.__kwdefaults__ and any(d is original for d in fn.__kwdefaults__.values()):
            old = fn.__kwdefaults__
            new = fn.__kwdefaults__ = {k: replacement if d is original else d for k, d in old.items()}
            self._undo.append((label + " (keyword defaults)", lambda: fn.__kwdefaults__ is new,
                               lambda: setattr(fn, "__kwdefaults__", old)))
            changed += 1
        return changed

    def undo(self):
        """Restores, newest first, every binding that still holds qlink's replacement;
        returns the labels of those another patcher has rebound since (left as they are)."""
        kept = []
        while self._undo:
            label, ours, restore = self._undo.pop()
            if ours():
                restore()
            else:
                kept.append(label)
        return kept
