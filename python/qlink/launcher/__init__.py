"""`qlink run`: a Python program run unchanged with qlink installed into GPTQModel and
AutoRound as they are first imported (settings.py: what it runs with; hooks.py: inside
the program's processes; summary.py: the report at exit)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from .settings import STATE_VARIABLE
from .summary import lines, merge

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def command_line(command):
    """`python` / `python3` first means the interpreter qlink is installed in (a venv's,
    whether or not it is activated)."""
    if command and command[0] in ("python", "python3"):
        return [sys.executable] + command[1:]
    return command


def run(settings, command):
    """Runs `command` with `settings` armed in its Python processes; prints the summary,
    writes the report if asked, returns the command's exit code."""
    report_dir = tempfile.mkdtemp(prefix="qlink-run-")
    env = dict(os.environ)
    env[STATE_VARIABLE] = json.dumps({"settings": vars(settings), "report_dir": report_dir})
    env["PYTHONPATH"] = os.pathsep.join([SITE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    command = command_line(command)
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the program's to handle
    try:
        try:
            code = subprocess.call(command, env=env)
        except OSError as error:
            print("qlink run: cannot start %s: %s" % (command[0], error.strerror), file=sys.stderr)
            return 127
        finally:
            signal.signal(signal.SIGINT, interrupt)
        code = code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
        report = merge(report_dir, settings, command, code)
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
    print("\n".join(lines(report)), file=sys.stderr)
    if settings.report:
        with open(settings.report, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return code
