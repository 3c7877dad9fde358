"""Stand-in for LogBar: levels to Python's logging (each with .once), progress bars and
column layouts that draw nothing."""
import logging
import threading

_log = logging.getLogger("gptqmodel")


class _Level:
    def __init__(self, level):
        self.level, self._seen, self._lock = level, set(), threading.Lock()

    def __call__(self, msg="", *args, **kwargs):
        try:
            text = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):  # a column layout's row: the cells themselves
            text = " ".join(map(str, (msg,) + args))
        _log.log(self.level, text)

    def once(self, msg="", *args, **kwargs):
        with self._lock:
            if msg in self._seen:
                return
            self._seen.add(msg)
        self(msg, *args)

    def __getattr__(self, name):  # a column layout's header(), simulate(), ...: nothing drawn
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class _Progress:
    """A progress bar that keeps count and draws nothing; every call chains."""

    def __init__(self, iterable=None, **kwargs):
        self._iterable = iterable if iterable is not None else ()
        self.current_iter_step = 0

    def __iter__(self):
        items = range(self._iterable) if isinstance(self._iterable, int) else self._iterable
        for item in items:
            self.current_iter_step += 1
            yield item

    def __len__(self):
        return self._iterable if isinstance(self._iterable, int) else len(self._iterable)

    def next(self, step=1):
        self.current_iter_step += int(step)
        return self

    def close(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self


class _Columns:
    def __init__(self, cols=(), padding=1, **kwargs):
        self.widths = [len(str(c.get("label", ""))) for c in cols]
        self.info = _Level(logging.INFO)


class LogBar:
    _shared = None

    def __init__(self):
        for name, level in (("info", logging.INFO), ("debug", logging.DEBUG), ("warn", logging.WARNING),
                            ("warning", logging.WARNING), ("error", logging.ERROR), ("exception", logging.ERROR),
                            ("critical", logging.CRITICAL)):
            setattr(self, name, _Level(level))
        self.info_once = self.info.once

    @classmethod
    def shared(cls, *args, **kwargs):
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def pb(self, iterable=None, **kwargs):
        return _Progress(iterable)

    def spinner(self, *args, **kwargs):
        return _Progress()

    def columns(self, cols=(), padding=1, **kwargs):
        return _Columns(cols, padding)

    def setLevel(self, *args, **kwargs):
        return None

    def isEnabledFor(self, *args, **kwargs):
        return False

    def is_enabled_for(self, *args, **kwargs):
        return False
