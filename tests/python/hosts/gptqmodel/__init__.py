"""Stand-in for GPTQModel: imports its looper, model and quantization modules eagerly, as the
real package does, and builds its device pool at its first use."""
import os

from . import looper, models, nn_modules, quantization, utils  # noqa: F401

# GPTQModel's device pool, built at its first use (get_device_thread_pool): here the worker
# counts it is built with.
_DEVICE_THREAD_POOL = None


def _default_cpu_workers():
    """GPTQModel's CPU pool size: GPTQMODEL_CPU_WORKERS where set, else min(12, cores / 2)."""
    env_workers = os.getenv("GPTQMODEL_CPU_WORKERS")
    if env_workers is not None:
        return max(1, int(env_workers))
    return min(12, max(1, ((os.cpu_count() or 1) + 1) // 2))


def get_device_thread_pool():
    global _DEVICE_THREAD_POOL
    if _DEVICE_THREAD_POOL is None:
        _DEVICE_THREAD_POOL = {"cpu": _default_cpu_workers(), "model_loader:cpu": 2}
    return _DEVICE_THREAD_POOL
