"""`qlink run`: a Python program run unchanged, with qlink installed into GPTQModel and
AutoRound as they are first imported (qlink.launcher)."""
import argparse
import sys

from ..launcher import run
from ..launcher.settings import SettingsError, resolve


def add_parser(commands):
    p = commands.add_parser(
        "run", help="run a Python program with qlink installed into its host packages",
        description="Runs COMMAND (`python SCRIPT ARGS...`: python is the interpreter qlink is installed in) "
                    "with qlink installed into GPTQModel and AutoRound as each is first imported. Settings: the "
                    "config file (JSON, or TOML on Python 3.11+), then QLINK_CONFIG, QLINK_INTEGRATIONS, "
                    "QLINK_STRICT, QLINK_REPORT, QLINK_BACKEND, QLINK_LOG_LEVEL, QLINK_PARALLEL_QUANTIZATION, "
                    "then these flags. Exits with COMMAND's exit code.")
    p.add_argument("--config", help="settings file (.json or .toml)")
    p.add_argument("--integrations", help="comma-separated: gptqmodel, autoround (default: both)")
    p.add_argument("--strict", action="store_const", const=True, default=None,
                   help="a failing qlink path raises instead of running the host's own code")
    p.add_argument("--report", help="write the summary as JSON to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- python SCRIPT ARGS...")
    p.set_defaults(handler=_run)


def _run(a):
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        print("qlink run: no command given (qlink run [options] -- python SCRIPT ARGS...)", file=sys.stderr)
        return 2
    try:
        settings = resolve(a.config, flags={"integrations": a.integrations, "strict": a.strict, "report": a.report})
    except SettingsError as error:
        print("qlink run: refused before starting %s: %s" % (" ".join(command), error), file=sys.stderr)
        return 2
    return run(settings, command)
