"""GPTQModel's CPU pool sized for the layer loop. The pool (DEVICE_THREAD_POOL's "cpu"
workers, built at its first use from _default_cpu_workers: min(12, cores / 2) threads) runs
each quantized module's finalize, its pack and disk offload, beside the next layer. Under a
GIL their Python takes the interpreter from the loop's main thread, which releases it around
every operator it launches and waits to take it back. install(cpu_workers=N) builds the
pool with N threads where the interpreter has a GIL and GPTQMODEL_CPU_WORKERS (GPTQModel's
own setting, which wins) is unset; a pool started before install() keeps its size, the
reason counted. Opt-in: the measurements are in docs/MOE.md."""
import os

from ...replicas import gil_enabled
from ..patches import like

PATCH = "cpu_workers"


def make_default_cpu_workers(installation, original):
    """gptqmodel._default_cpu_workers for `installation` (its cpu_workers setting)."""
    counters = installation.counters
    if installation.names["gptqmodel:_DEVICE_THREAD_POOL"] is not None:  # as install() found it
        counters.host(PATCH, "GPTQModel's CPU pool was started before install()")

    @like(original)
    def _default_cpu_workers():
        if os.getenv("GPTQMODEL_CPU_WORKERS") is not None:
            counters.host(PATCH, "GPTQMODEL_CPU_WORKERS is set")
            return original()
        if not gil_enabled():
            counters.host(PATCH, "no GIL (free-threaded Python)")
            return original()
        counters.qlink(PATCH)
        return installation.cpu_workers
    return _default_cpu_workers
