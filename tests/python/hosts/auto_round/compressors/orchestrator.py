import gc

from auto_round.utils import mv_module_from_gpu  # noqa: F401 (imported by name, as AutoRound's is)


class CompressionOrchestrator:
    """AutoRound's entry (AutoRound(...) for a language model): quantize() runs the block
    loop, clearing memory between blocks with gc.collect(). The stand-in runs `work` and
    records, at each clearing, how many objects the collector has frozen."""

    def __init__(self, work=None):
        self.work, self.freeze_counts = work, []

    def quantize(self):
        if self.work is not None:
            self.work()
        self.freeze_counts.append(gc.get_freeze_count())
        gc.collect()
        return self
