"""The launcher's side of the report: the per-process parts the script's processes wrote
(hooks.Run.write) merged into one, and the few lines printed at exit."""
import glob
import json
import os

from .settings import HOSTS

_COUNTS = ("qlink", "host", "fallback")


def _add_counters(total, counters):
    for patch, c in counters.items():
        t = total.setdefault(patch, {"qlink": 0, "host": 0, "fallback": 0, "reasons": {}})
        for key in _COUNTS:
            t[key] += c[key]
        for reason, n in c["reasons"].items():
            t["reasons"][reason] = t["reasons"].get(reason, 0) + n


def merge(report_dir, settings, command, exit_code):
    """The run's report: per integration, its state over every process (installed where
    any installed it), the host's version, the counters summed, any failure."""
    processes = []
    for path in sorted(glob.glob(os.path.join(report_dir, "process-*.json"))):
        with open(path) as f:
            processes.append(json.load(f))
    integrations = {}
    for name in settings.integrations:
        merged = {"host": HOSTS[name], "state": "not imported", "counters": {}}
        for p in processes:
            part = p.get("integrations", {}).get(name)
            if part is None:
                continue
            if part["state"] == "installed" or merged["state"] == "not imported":
                merged["state"] = part["state"]
            for key in ("version", "error"):
                if part.get(key):
                    merged[key] = part[key]
            _add_counters(merged["counters"], part["counters"])
        integrations[name] = merged
    return {"command": command, "exit_code": exit_code, "settings": vars(settings).copy(),
            "processes": len(processes), "errors": [p["error"] for p in processes if "error" in p],
            "integrations": integrations}


def lines(report):
    """The summary printed at exit."""
    out = ["qlink run: exit code %d, %d process(es) reported" % (report["exit_code"], report["processes"])]
    if report["processes"] == 0:
        out.append("  no process of the command reported: not a Python program, or it ended without "
                   "running its exit handlers (os._exit, a signal)")
    out.extend("  " + e for e in report["errors"])
    for name, r in report["integrations"].items():
        host = "package %s%s" % (r["host"], ", version " + r["version"] if r.get("version") else "")
        if r["state"] == "not imported":
            out.append("  %s: %s was never imported; nothing to install into" % (name, r["host"]))
            continue
        if r["state"] == "failed":
            out.append("  %s (%s): not installed: %s" % (name, host, r.get("error", "")))
            continue
        out.append("  %s (%s): installed" % (name, host))
        for patch, c in r["counters"].items():
            if not any(c[k] for k in _COUNTS):
                continue
            out.append("    %-28s through qlink %d, host's by design %d, fell back %d" % (
                patch, c["qlink"], c["host"], c["fallback"]))
            for reason, n in sorted(c["reasons"].items(), key=lambda item: -item[1]):
                out.append("      %dx %s" % (n, reason))
    return out
