"""`qlink plan`: the data-parallel plan AutoRound's parallel_quantization would resolve
to on the configured backend (qlink.plan's rules over the backend's devices and their
free memory).

    qlink plan --parallel auto|N|off --iters N --batch-size N [--mirror-gib G] [--config JSON] [--library PATH]
"""
import json

from ..context import Context
from ..plan import GIB, PlanRefused, resolve_plan


def _parallel(text):
    return text if text in ("off", "auto") else int(text)


def add_parser(commands):
    plan = commands.add_parser("plan", help="the devices parallel_quantization engages, and why others are not")
    plan.add_argument("--parallel", type=_parallel, default="auto", help="off, auto or a replica count")
    plan.add_argument("--iters", type=int, default=200, help="tuning iterations (0: round to nearest)")
    plan.add_argument("--batch-size", type=int, default=8)
    plan.add_argument("--mirror-gib", type=float, default=0.0,
                      help="what one block mirror needs (parameters, tuning state, activations); the 2 GiB "
                           "margin is added")
    plan.add_argument("--config", default="{}", help="the qlink JSON config (backend, ...)")
    plan.add_argument("--library", default=None, help="libqlink.so (default: the package's own)")
    plan.set_defaults(handler=_plan)


def _plan(a):
    with Context(json.loads(a.config), a.library) as ctx:
        devices = ctx.devices()
        print("backend: %s, %d device(s)%s" %
              (ctx.backend, len(devices), ": virtual, in CPU memory" if ctx.cpu_memory else ""))
        try:
            resolved = resolve_plan(a.parallel, [d.index for d in devices], a.iters, a.batch_size,
                                    free_bytes={d.index: d.free_bytes for d in devices},
                                    mirror_parts={"mirror": int(a.mirror_gib * GIB)})
        except PlanRefused as refused:
            print("refused: parallel_quantization=%s cannot engage" % (a.parallel,))
            for reason in refused.reasons:
                print("  " + reason)
            return 1
        print(resolved.describe())
    return 0
