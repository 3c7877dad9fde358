"""What `qlink run` runs with: a config file (JSON, or TOML on Python 3.11+), then the
QLINK_* environment, then the command line, each overriding the one before. Everything is
checked before the script starts; a refusal names the field and where it came from.

    integrations = ["gptqmodel", "autoround"]   # the hosts to install qlink into (default: both)
    strict = false                              # a failing qlink path raises instead of falling back
    report = "qlink-report.json"                # the summary as JSON, written at exit
    [qlink]                                     # the context's config (README: Config)
    backend = "cuda"
    [gptqmodel]                                 # qlink.integrations.gptqmodel.install's options
    expert_stage = true                         # MoE expert subsets through qlink's owned stage
    [autoround]                                 # qlink.integrations.autoround.install's options
    parallel_quantization = "auto"
    transport = "fp32"
    grouped_moe = true                          # unfused MoE blocks' experts as grouped GEMMs
"""
import dataclasses
import json
import os

# integration name -> the host package whose first import installs it
HOSTS = {"gptqmodel": "gptqmodel", "autoround": "auto_round"}
# The launcher's channel to the processes it starts; never a setting.
STATE_VARIABLE = "QLINK_LAUNCHER_STATE"
_AUTOROUND_FIELDS = {"parallel_quantization", "transport", "grouped_moe"}
_GPTQMODEL_FIELDS = {"expert_stage"}


class SettingsError(ValueError):
    """A setting refused before the script starts; the message names it."""


@dataclasses.dataclass
class Settings:
    integrations: list = dataclasses.field(default_factory=lambda: list(HOSTS))
    strict: bool = False
    report: str = ""
    qlink: dict = dataclasses.field(default_factory=dict)
    autoround: dict = dataclasses.field(default_factory=dict)
    gptqmodel: dict = dataclasses.field(default_factory=dict)


def _parse_file(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise SettingsError("config file %s cannot be read: %s" % (path, error.strerror)) from error
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError as error:
            raise SettingsError("config file %s: TOML needs Python 3.11 or later; use JSON" % path) from error
        try:
            return tomllib.loads(data.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise SettingsError("config file %s is not valid TOML: %s" % (path, error)) from error
    try:
        value = json.loads(data)
    except ValueError as error:
        raise SettingsError("config file %s is not valid JSON: %s" % (path, error)) from error
    if not isinstance(value, dict):
        raise SettingsError("config file %s must hold an object, got %s" % (path, type(value).__name__))
    return value


def _integrations(value, where):
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SettingsError("%s: integrations must be a list of names, got %r" % (where, value))
    for name in value:
        if name not in HOSTS:
            raise SettingsError("%s: integrations: unknown integration %r (known: %s)" % (
                where, name, ", ".join(sorted(HOSTS))))
    return list(dict.fromkeys(value))


def _boolean(value, field, where):
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    if not isinstance(value, bool):
        raise SettingsError("%s: %s must be true or false, got %r" % (where, field, value))
    return value


def _merge(settings, values, where):
    """values (a file's object, the environment's or the flags' settings) over settings."""
    for field, value in values.items():
        if field == "integrations":
            settings.integrations = _integrations(value, where)
        elif field == "strict":
            settings.strict = _boolean(value, "strict", where)
        elif field == "report":
            if not isinstance(value, str) or not value:
                raise SettingsError("%s: report must be a file path, got %r" % (where, value))
            settings.report = value
        elif field == "qlink":
            if not isinstance(value, dict):
                raise SettingsError("%s: qlink must be an object (the context's config), got %r" % (where, value))
            settings.qlink = {**settings.qlink, **value}
        elif field == "gptqmodel":
            value = _section(value, "gptqmodel", _GPTQMODEL_FIELDS, where)
            settings.gptqmodel = {**settings.gptqmodel, **value}
        elif field == "autoround":
            value = _section(value, "autoround", _AUTOROUND_FIELDS, where)
            if "parallel_quantization" in value:
                value = dict(value, parallel_quantization=_parallel(value["parallel_quantization"], where))
            if value.get("transport", "fp32") not in ("fp32", "bf16"):
                raise SettingsError("%s: autoround.transport must be \"fp32\" or \"bf16\", got %r" % (
                    where, value["transport"]))
            settings.autoround = {**settings.autoround, **value}
        else:
            raise SettingsError("%s: unknown field %r (known: autoround, gptqmodel, integrations, qlink, report, "
                                "strict)" % (where, field))


def _section(value, name, fields, where):
    """An integration's section: an object of known fields, its switches booleans."""
    if not isinstance(value, dict):
        raise SettingsError("%s: %s must be an object, got %r" % (where, name, value))
    unknown = set(value) - fields
    if unknown:
        raise SettingsError("%s: %s: unknown field %r (known: %s)" % (
            where, name, sorted(unknown)[0], ", ".join(sorted(fields))))
    switches = ("expert_stage", "grouped_moe")
    return dict(value, **{f: _boolean(value[f], "%s.%s" % (name, f), where) for f in switches if f in value})


# QLINK_* variable -> (setting, field inside it or None)
_ENVIRONMENT = {
    "QLINK_CONFIG": ("config", None),
    "QLINK_INTEGRATIONS": ("integrations", None),
    "QLINK_STRICT": ("strict", None),
    "QLINK_REPORT": ("report", None),
    "QLINK_BACKEND": ("qlink", "backend"),
    "QLINK_LOG_LEVEL": ("qlink", "log_level"),
    "QLINK_PARALLEL_QUANTIZATION": ("autoround", "parallel_quantization"),
}


def environment_settings(environ):
    """The QLINK_* variables of `environ` as {setting: value}; an unknown QLINK_ variable
    is refused (a misspelt one would otherwise do nothing)."""
    values = {}
    for variable in sorted(environ):
        if not variable.startswith("QLINK_") or variable == STATE_VARIABLE:
            continue
        if variable not in _ENVIRONMENT:
            raise SettingsError("environment variable %s is not one qlink run reads (known: %s)" % (
                variable, ", ".join(sorted(_ENVIRONMENT))))
        setting, field = _ENVIRONMENT[variable]
        if field is None:
            values[setting] = environ[variable]
        else:
            values.setdefault(setting, {})[field] = environ[variable]
    return values


def _parallel(value, where):
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if value in ("auto", "off") or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise SettingsError("%s: autoround.parallel_quantization must be \"auto\", \"off\" or a replica count, got %r" % (
        where, value))


def resolve(config_file=None, environ=None, flags=None):
    """Settings from the file (the flag's, else QLINK_CONFIG's), the environment and the
    flags ({setting: value}, None where not given), in that order; SettingsError names
    the first refused field."""
    environ = os.environ if environ is None else environ
    env = environment_settings(environ)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    settings = Settings()
    path = config_file or env.pop("config", None)  # the flag's file replaces QLINK_CONFIG's
    env.pop("config", None)
    if path:
        _merge(settings, _parse_file(path), "config file %s" % path)
    _merge(settings, env, "environment")
    _merge(settings, flags, "command line")
    _check_context_config(settings.qlink)
    if settings.report:
        folder = os.path.dirname(os.path.abspath(settings.report))
        if not os.path.isdir(folder):
            raise SettingsError("report %s: folder %s does not exist" % (settings.report, folder))
    return settings


def _check_context_config(config):
    """The context's config through the plugin's own parser, before any script runs: on
    the CPU backend (no device touched), with the backend named checked apart."""
    from ..context import Context
    from ..errors import QlinkError
    backend = config.get("backend", "auto")
    if not isinstance(backend, str) or not (backend in ("auto", "cuda", "hip", "cpu") or os.path.isfile(backend)):
        raise SettingsError("qlink.backend must be auto, cuda, hip, cpu or the path of a backend library, got %r" % (
            backend,))
    try:
        Context(dict(config, backend="cpu")).close()
    except (QlinkError, TypeError) as error:
        raise SettingsError("qlink: %s" % error) from error
