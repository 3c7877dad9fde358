"""Started by `qlink run` (its folder first on PYTHONPATH): arms qlink's installation into
the host packages of this process, then runs the sitecustomize this one shadows, if any."""
import importlib.machinery
import importlib.util
import json
import os
import sys


def _arm():
    state = json.loads(os.environ["QLINK_LAUNCHER_STATE"])
    try:
        from qlink.launcher.hooks import Run
        from qlink.launcher.settings import Settings
    except ImportError as error:
        # Another interpreter than qlink's: say so in the report rather than run silently without it.
        path = os.path.join(state["report_dir"], "process-%d.json" % os.getpid())
        with open(path, "w") as f:
            json.dump({"pid": os.getpid(), "argv": sys.argv, "error": "qlink is not importable from %s: %s" % (
                sys.executable, error)}, f)
        return
    Run(Settings(**state["settings"]), state["report_dir"]).start()


def _chain():
    """The next sitecustomize on sys.path (the distribution's or the environment's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if "QLINK_LAUNCHER_STATE" in os.environ:
    _arm()
_chain()
