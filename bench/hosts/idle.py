"""Where the GPU waits on the host: every thread's Python stack sampled with a timestamp while
torch.profiler records the device's kernels, then each sample's stretch of time split into
the part with no kernel running (idle) and the rest, and the idle part charged to the
stacks the threads were in. The profiler's clock and the sampler's meet at a mark: a
profiler range whose host time is noted when it opens (mark()).

    sampler = Sampler(); sampler.start()
    with torch.profiler.profile(...) as prof:
        mark("loop")            # the window starts here (and the clocks meet)
        ...
    sampler.stop()
    report(prof, sampler, "loop", "idle.txt")
"""
import bisect
import collections
import os
import sys
import threading
import time

from common import device_spans, merged_spans

_MARKS = {}
_WAITS = ("threading.py", "queue.py", "selectors.py", "thread.py")  # where idle pool threads sit


def mark(name):
    """A profiler range named name; the host clock at its first opening is kept for report()."""
    import torch
    _MARKS.setdefault(name, time.perf_counter_ns())
    with torch.profiler.record_function(name):
        pass


def _where(frame):
    code = frame.f_code
    path = code.co_filename
    short = "/".join(path.split(os.sep)[-2:]) if path.startswith("/") else path
    return "%s:%d(%s)" % (short, code.co_firstlineno, code.co_name)


class Sampler:
    """Every thread's stack every interval_s, innermost frame first (at most depth frames)."""

    def __init__(self, interval_s=0.001, depth=40):
        self.interval_s, self.depth = interval_s, depth
        self.samples = []  # (perf_counter_ns, {thread name: (frame, ...)})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            frames = sys._current_frames()
            now = time.perf_counter_ns()
            stacks = {}
            for ident, frame in frames.items():
                if ident == me:
                    continue
                stack = []
                while frame is not None and len(stack) < self.depth:
                    stack.append(_where(frame))
                    frame = frame.f_back
                stacks[names.get(ident, str(ident))] = tuple(stack)
            self.samples.append((now, stacks))

    def start(self):
        """Starts sampling; later calls do nothing."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()


def _busy_before(merged, starts, prefix, t):
    """Busy time of the merged intervals (their starts, their prefix sums) before t."""
    i = bisect.bisect_right(starts, t)
    if i == 0:
        return 0.0
    a, b = merged[i - 1]
    return prefix[i - 1] + min(t, b) - a


def innermost_segments(events, lo, hi):
    """[(start, end, name)] covering [lo, hi]: which of one thread's events (start, end, name),
    nested as a thread's events are, was the innermost open at each moment (None: no event)."""
    out, stack, t = [], [], lo

    def advance(upto):
        nonlocal t
        while stack and stack[-1][0] <= upto:
            end, name = stack.pop()
            if end > t:
                out.append((t, end, name))
                t = end
        if upto > t:
            out.append((t, upto, stack[-1][1] if stack else None))
            t = upto

    for a, b, name in sorted(events, key=lambda e: (e[0], -e[1])):
        if b <= lo:
            continue
        if a >= hi:
            break
        advance(max(a, lo))
        stack.append((min(b, hi, stack[-1][0]) if stack else min(b, hi), name))
    advance(hi)
    return out


def _operator_idle(prof, mark_name, busy_between, start_us, end_us):
    """Idle µs by the innermost host event (operator or CUDA runtime call) of the thread that
    opened mark_name: what the loop's thread was inside while the device had nothing to run."""
    events = prof.events()
    thread = min((e for e in events if e.name == mark_name), key=lambda e: e.time_range.start).thread
    host = [(e.time_range.start, e.time_range.end, e.name) for e in events
            if e.thread == thread and str(e.device_type) == "DeviceType.CPU" and e.name != mark_name]
    idle = collections.Counter()
    for a, b, name in innermost_segments(host, start_us, end_us):
        idle[name or "(no operator: Python or the GIL)"] += (b - a) - busy_between(a, b)
    return idle


def report(prof, sampler, mark_name, path, rows=25, threads=8, chain=6):
    """Writes to path: the window's length (the mark to the last kernel), its idle time, the
    idle time by the loop thread's innermost operator or runtime call, and for each thread
    that was not waiting in a pool or queue for part of it (at most `threads`), the idle time
    by its innermost frame, by its innermost `chain` frames, and by the frames on its stack."""
    start_host = _MARKS.get(mark_name)
    opened = [e.time_range.start for e in prof.events() if e.name == mark_name]
    if start_host is None or not opened:
        raise RuntimeError("mark %r was not recorded under the profiler" % mark_name)
    start_us = min(opened)
    merged = merged_spans(device_spans(prof, start_us)["kernel"])
    end_us = merged[-1][1] if merged else start_us
    starts, prefix, total = [a for a, _ in merged], [], 0.0
    for a, b in merged:
        prefix.append(total)
        total += b - a

    def busy_between(a, b):
        return _busy_before(merged, starts, prefix, b) - _busy_before(merged, starts, prefix, a)

    inner, inclusive = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    chains = collections.defaultdict(collections.Counter)
    working = collections.Counter()
    previous = None
    for now, stacks in sampler.samples:
        t = start_us + (now - start_host) / 1e3
        if previous is not None and t > start_us and previous < end_us:
            a, b = max(previous, start_us), min(t, end_us)
            idle = (b - a) - busy_between(a, b)
            if idle > 0:
                for thread, stack in stacks.items():
                    if not stack:
                        continue
                    inner[thread][stack[0]] += idle
                    chains[thread][" < ".join(stack[:chain])] += idle
                    for name in set(stack):
                        inclusive[thread][name] += idle
                    if not stack[0].split(":")[0].endswith(_WAITS):
                        working[thread] += idle
        previous = t
    window = end_us - start_us
    with open(path, "w") as f:
        f.write("window %.3f s from %s to the last kernel; kernels %.3f s (%.1f %%), idle %.3f s\n\n"
                % (window / 1e6, mark_name, total / 1e6, 100 * total / max(window, 1), (window - total) / 1e6))
        f.write("the loop thread's innermost operator or runtime call while the device was idle\n")
        for name, us in _operator_idle(prof, mark_name, busy_between, start_us, end_us).most_common(rows):
            f.write("  %8.3f s  %s\n" % (us / 1e6, name))
        f.write("\n")
        for thread, busy in working.most_common(threads):
            f.write("thread %s: idle time while it was not waiting %.3f s\n" % (thread, busy / 1e6))
            for title, table in (("innermost", inner[thread]), ("innermost %d frames" % chain, chains[thread]),
                                 ("on the stack", inclusive[thread])):
                f.write("  %s\n" % title)
                for name, us in table.most_common(rows):
                    f.write("  %8.3f s  %s\n" % (us / 1e6, name))
            f.write("\n")
