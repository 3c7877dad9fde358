"""The `qlink` command (also `python3 -m qlink`):

    qlink probe|demo [--config JSON] [--bytes N]   the native CLI beside libqlink.so
    qlink plan --parallel auto|N|off ...           AutoRound's data-parallel plan on this machine
    qlink run [--config FILE] [--integrations gptqmodel,autoround] [--strict] [--report FILE]
              -- python SCRIPT ARGS...             the script unchanged, with qlink installed into its hosts
    qlink env [--json] [--config JSON]             what a bug report needs
    qlink --version
"""
import argparse
import sys

from .. import _abi
from .._version import __version__
from . import env, native, plan, run


def version_text():
    return "qlink %s (C ABI %d.%d)" % (__version__, _abi.ABI_MAJOR, _abi.ABI_MINOR)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="qlink", description="qlink: multi-GPU data movement for LLM quantization")
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (native, plan, run, env):
        module.add_parser(commands)
    a = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return a.handler(a)
