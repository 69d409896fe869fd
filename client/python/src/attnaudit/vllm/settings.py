"""The vLLM plugin's settings: environment variables, or a config file.

The plugin is inactive unless a server address is configured. Every setting
has an environment variable ATTNAUDIT_VLLM_<NAME> (upper case) and a key
<name> in the optional config file named by ATTNAUDIT_VLLM_CONFIG (JSON, or
TOML when the name ends in .toml); the environment wins over the file.

    server          attnaudit address(es), e.g. "attnaudit:50051" or a fleet
                    target (see AuditClient). Unset: the plugin is off.
    enable          "0" turns the plugin off even with a server set.
    token / token_file   bearer token (token_file: read once at start).
    tls_ca          CA bundle for TLS; "system" for the system roots.
    layers          "all" (default) or layer indices "0,15,31".
    rotate_layers   "1" (default): one layer per sampled step, in turn, so
                    a step costs one snapshot; "0": every listed layer.
    sample_every    audit every Nth engine step (default 100).
    sample_rate     instead: audit a step with this probability (0..1),
                    decided by a hash of (seed, step): every rank of a
                    tensor-parallel group decides alike.
    seed            the hash's seed (default 0).
    request_filter  a regular expression: only requests whose id matches
                    are audited (their rows of the batch).
    request_fraction  only requests whose id hashes below this fraction.
    max_rows        at most this many sequences per snapshot (default 8).
    max_snapshot_mb   rows are kept while their K/V pages fit in this many
                    MiB (default 256); a single row larger is not audited
                    (counted as too_large). With max_in_flight, the bound
                    on the memory the plugin holds.
    max_in_flight   snapshots held at once (default 2); more are dropped.
    priority        "sampled" (default) or "interactive".
    mode            "audit" (default) or "submit" (durable jobs).
    timeout         seconds per call (default 120).
    rope_check      "1" (default): capture pre-RoPE q and k for the rolling
                    RoPE check; "0": post-RoPE only.
    engine          precision preset (attnaudit.ENGINE_PRESETS); default:
                    the backend's ("vllm-cpu" for CPU_ATTN, "vllm" for
                    FlashAttention, "flash-decoding" for FlashInfer). With
                    probe on, the fallback when the probe cannot run.
    probe           "1" (default): measure the backend's arithmetic once
                    per process at start-up (attnaudit.probe, a few
                    seconds) and declare it on every snapshot (source
                    "measured"); "0": declare the preset.
    model, run      labels (model default: the served model name; a local
                    checkpoint path by its last component).
    on_step         callbacks "pkg.module:function[,...]", each called with
                    a StepSummary per audited step (a background thread).
    log_summary     "1": log each StepSummary at INFO (logger
                    "attnaudit.vllm"); default "1".

A value that does not parse, or an ATTNAUDIT_VLLM_* variable that names no
setting, raises SettingsError naming it (with the nearest setting's name).
vLLM calls the plugin's register() outside its own error handling, so the
error stops vLLM's start-up: an audit its user asked for is never silently
off.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from typing import Any, List, Mapping, Optional, Tuple

ENV_PREFIX = "ATTNAUDIT_VLLM_"
CONFIG_ENV = "ATTNAUDIT_VLLM_CONFIG"


class SettingsError(ValueError):
    """A setting that cannot be parsed; the message names it."""


@dataclasses.dataclass(frozen=True)
class Settings:
    server: Optional[str] = None
    enable: bool = True
    token: Optional[str] = None
    tls_ca: Optional[str] = None
    layers: Optional[Tuple[int, ...]] = None  # None: all layers
    rotate_layers: bool = True
    sample_every: int = 100
    sample_rate: Optional[float] = None
    seed: int = 0
    request_filter: Optional[str] = None
    request_fraction: Optional[float] = None
    max_rows: int = 8
    max_snapshot_mb: float = 256.0
    max_in_flight: int = 2
    priority: str = "sampled"
    mode: str = "audit"
    timeout: float = 120.0
    rope_check: bool = True
    engine: Optional[str] = None
    probe: bool = True
    model: Optional[str] = None
    run: Optional[str] = None
    on_step: Tuple[str, ...] = ()
    log_summary: bool = True

    @property
    def active(self) -> bool:
        return self.enable and bool(self.server)


def load(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The settings from `environ` (default os.environ) and its config file."""
    env = os.environ if environ is None else environ
    raw: dict = {}
    path = env.get(CONFIG_ENV)
    if path:
        raw.update(_read_file(path))
    _refuse_unknown_names(env)
    for field in dataclasses.fields(Settings):
        value = env.get(ENV_PREFIX + field.name.upper())
        if value is not None and value != "":
            raw[field.name] = value
    token_file = raw.pop("token_file", None) or env.get(ENV_PREFIX + "TOKEN_FILE")
    if token_file and not raw.get("token"):
        try:
            with open(token_file, encoding="utf-8") as f:
                raw["token"] = f.read().strip()
        except OSError as e:
            raise SettingsError(f"token_file: cannot read {token_file!r}: {e}") from None
    return from_mapping(raw)


def _refuse_unknown_names(env: Mapping[str, str]) -> None:
    """A misspelt ATTNAUDIT_VLLM_* variable would otherwise be ignored, and
    the plugin run with a default its user meant to change."""
    known = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
    known |= {CONFIG_ENV, ENV_PREFIX + "TOKEN_FILE"}
    for name in sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known):
        raise SettingsError(f"unknown setting {name}{_nearest(name, known)}")


def _nearest(name: str, known) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def from_mapping(raw: Mapping[str, Any]) -> Settings:
    """Settings from a dict of strings (or typed values, from a file)."""
    known = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SettingsError(f"unknown setting(s) {unknown}{_nearest(unknown[0], known)}; "
                            "expected " + ", ".join(sorted(known | {'token_file'})))
    out: dict = {}
    for name, value in raw.items():
        out[name] = _PARSERS.get(name, _text)(name, value)
    s = Settings(**out)
    _check(s)
    return s


def _check(s: Settings) -> None:
    if s.sample_every < 1:
        raise SettingsError(f"sample_every: must be >= 1, got {s.sample_every}")
    for name in ("sample_rate", "request_fraction"):
        v = getattr(s, name)
        if v is not None and not 0.0 <= v <= 1.0:
            raise SettingsError(f"{name}: must be in [0, 1], got {v}")
    if s.max_rows < 1:
        raise SettingsError(f"max_rows: must be >= 1, got {s.max_rows}")
    if s.max_snapshot_mb <= 0:
        raise SettingsError(f"max_snapshot_mb: must be > 0, got {s.max_snapshot_mb}")
    if s.max_in_flight < 1:
        raise SettingsError(f"max_in_flight: must be >= 1, got {s.max_in_flight}")
    if s.mode not in ("audit", "submit"):
        raise SettingsError(f"mode: {s.mode!r}; expected 'audit' or 'submit'")
    if s.priority not in ("sampled", "interactive"):
        raise SettingsError(f"priority: {s.priority!r}; expected 'sampled' or "
                            "'interactive'")
    if s.request_filter is not None:
        try:
            re.compile(s.request_filter)
        except re.error as e:
            raise SettingsError(f"request_filter: not a regular expression: {e}") from None
    for spec in s.on_step:
        if not re.fullmatch(r"[\w.]+:[\w.]+", spec):
            raise SettingsError(f"on_step: {spec!r} is not 'package.module:function'")


def _read_file(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SettingsError(f"{CONFIG_ENV}: cannot read {path!r}: {e}") from None
    try:
        if path.endswith(".toml"):
            import tomllib
            parsed = tomllib.loads(data.decode("utf-8"))
        else:
            parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise SettingsError(f"{CONFIG_ENV}: {path!r} does not parse: {e}") from None
    if not isinstance(parsed, dict):
        raise SettingsError(f"{CONFIG_ENV}: {path!r} must hold a table of settings")
    return parsed


def _text(name: str, v: Any) -> str:
    return str(v)


def _int(name: str, v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise SettingsError(f"{name}: expected an integer, got {v!r}") from None


def _float(name: str, v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise SettingsError(f"{name}: expected a number, got {v!r}") from None


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}: expected 0/1/true/false, got {v!r}")


def _layers(name: str, v: Any) -> Optional[Tuple[int, ...]]:
    if isinstance(v, (list, tuple)):
        items: List[Any] = list(v)
    else:
        text = str(v).strip()
        if text.lower() == "all":
            return None
        items = [x for x in re.split(r"[,\s]+", text) if x]
    layers = tuple(_int(name, x) for x in items)
    if not layers or any(x < 0 for x in layers):
        raise SettingsError(f"{name}: expected 'all' or layer indices >= 0, got {v!r}")
    return layers


def _callbacks(name: str, v: Any) -> Tuple[str, ...]:
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    return tuple(str(x).strip() for x in items if str(x).strip())


_PARSERS = {
    "enable": _bool, "rotate_layers": _bool, "rope_check": _bool, "probe": _bool,
    "log_summary": _bool, "sample_every": _int, "seed": _int, "max_rows": _int,
    "max_in_flight": _int, "sample_rate": _float, "request_fraction": _float,
    "max_snapshot_mb": _float,
    "timeout": _float, "layers": _layers, "on_step": _callbacks,
}
