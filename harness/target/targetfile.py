"""Target files: reading and checking one (TOML -> ``TargetSpec``), every mistake a one-line
ConfigError naming the file and the entry (see docs/targets.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError, UsageError
from harness.target.serverfacts import SOURCES
from harness.target.spec import (
    ANY_LEVEL,
    BUILTIN_VARS,
    ENV_REF,
    MODES,
    READINESS_PATHS,
    HookSpec,
    LaunchSpec,
    LevelSpec,
    ReadySpec,
    TargetSpec,
    placeholders,
    substitute,
)
from harness.tomlfile import read_toml

_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEVEL = re.compile(r"^[A-Za-z0-9_.:+\-]+$")


def default_sim_target() -> TargetSpec:
    """The shipped default: the embedded simulator launched per variant."""
    here = Path(__file__).resolve().parents[2] / "scenarios" / "targets" / "sim.toml"
    return load_target(here)


def load_target(path: Path, *, var_overrides: Mapping[str, str] | None = None) -> TargetSpec:
    """Read and validate a target file.

    ``var_overrides`` (``--target-var NAME=VALUE``) replace entries of ``[vars]``; ``model``
    replaces the top-level ``model``. They are argv values, never shell text.
    """
    path = Path(path)
    raw = read_toml(path, "target")
    return _Builder(path, raw, dict(var_overrides or {})).build()


class _Builder:
    def __init__(self, path: Path, raw: dict[str, Any], overrides: dict[str, str]) -> None:
        self.path = path
        self.raw = raw
        self.overrides = overrides

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: {what}")

    def build(self) -> TargetSpec:
        raw = self.raw
        allowed = {
            "name", "mode", "description", "model", "served_model", "vars", "ready", "launch",
            "hook", "base_url", "endpoints", "factors", "warm_up", "flush_cache", "metrics",
            "verify", "deterministic", "alone",
        }  # fmt: skip
        self._no_unknown(raw, allowed, "top level")
        mode = raw.get("mode")
        if mode not in MODES:
            raise self.fail(f"'mode' must be one of {', '.join(MODES)} (got {mode!r})")
        name = self._str(raw, "name", self.path.stem)
        model = self.overrides.pop("model", None) or self._str(raw, "model", "")
        variables = self._vars()
        served = raw.get("served_model")
        if served is not None and not isinstance(served, str):
            raise self.fail("'served_model' must be a string")
        values = {**variables, "model": model}
        factors = self._factors(mode, values)
        spec: dict[str, Any] = {}
        if mode == "launch":
            spec["launch"] = self._launch(values)
            spec["alone_args"] = self._alone(values)
        elif raw.get("alone") is not None:
            raise self.fail(f'an [alone] table is only used with mode = "launch", not {mode!r}')
        if mode != "launch" and raw.get("launch") is not None:
            raise self.fail(f'a [launch] table is only used with mode = "launch", not {mode!r}')
        if mode == "hook":
            spec["hook"] = self._hook(values)
            spec["base_url"] = self._url(raw.get("base_url"), "base_url", values)
        elif raw.get("hook") is not None:
            raise self.fail(f'a [hook] table is only used with mode = "hook", not {mode!r}')
        if mode == "endpoint":
            spec["endpoints"] = self._endpoints(values)
        elif raw.get("endpoints") is not None:
            raise self.fail('an [endpoints] table is only used with mode = "endpoint"')
        verify = self._verify_tables()
        for factor, levels in verify.items():
            if mode == "endpoint":
                known = sorted(
                    {lvl for key, _ in spec["endpoints"] for f, lvl in key if f == factor}
                )
            else:
                known = list(factors.get(factor, {}))
            for level in levels:
                if level not in known:
                    raise self.fail(
                        f"[verify.{factor}.{level}]: the file defines no level {level!r} of "
                        f"factor {factor!r} (its levels: {', '.join(known) or 'none'})"
                    )
        return TargetSpec(
            path=self.path,
            name=name,
            mode=mode,
            description=self._str(raw, "description", ""),
            model=model,
            served_model=served,
            vars=MappingProxyType(variables),
            ready=self._ready(),
            factors=MappingProxyType({k: MappingProxyType(v) for k, v in factors.items()}),
            warm_up=self._bool(raw, "warm_up", True),
            flush_cache=self._bool(raw, "flush_cache", mode != "launch"),
            metrics=self._bool(raw, "metrics", True),
            deterministic=self._bool(raw, "deterministic", False),
            verify=verify,
            **spec,
        )

    # -- pieces ---------------------------------------------------------------------------

    def _alone(self, values: Mapping[str, str]) -> tuple[str, ...] | None:
        """``[alone] args``: what to add to a variant's command for a fresh server that takes
        requests one at a time (the corrupted turns re-sent alone after the load)."""
        if self.raw.get("alone") is None:
            return None
        table = self._table(self.raw, "alone")
        self._no_unknown(table, {"args"}, "[alone]")
        args = self._str_list(table, "args", "[alone]")
        for arg in args:
            self._check_placeholders(arg, values, "[alone]")
        return tuple(args)

    def _vars(self) -> dict[str, str]:
        table = self._table(self.raw, "vars")
        out: dict[str, str] = {}
        for key, value in table.items():
            if not _VAR_NAME.match(key) or key in BUILTIN_VARS:
                raise self.fail(
                    f"[vars] {key!r}: a variable name is letters, digits and _ and not one of "
                    f"the built-in placeholders ({', '.join(BUILTIN_VARS)})"
                )
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise self.fail(f"[vars] {key}: give a string or a number")
            out[key] = str(value)
        for key, value in self.overrides.items():
            if key not in out:
                defined = ", ".join(out) or "none"
                raise UsageError(
                    f"{self.path}: --target-var {key}: the file has no such variable "
                    f"(its [vars]: {defined})"
                )
            out[key] = value
        return out

    def _ready(self) -> ReadySpec:
        table = self._table(self.raw, "ready")
        self._no_unknown(table, {"paths", "timeout_s", "interval_s"}, "[ready]")
        paths = table.get("paths", list(READINESS_PATHS))
        if (
            not isinstance(paths, list)
            or not paths
            or not all(isinstance(p, str) and p.startswith("/") for p in paths)
        ):
            raise self.fail('[ready] paths: give a list of URL paths such as ["/health"]')
        timeout = self._number(table, "timeout_s", 600.0, "[ready]")
        interval = self._number(table, "interval_s", 2.0, "[ready]")
        return ReadySpec(tuple(paths), timeout, interval)

    def _factors(self, mode: str, values: Mapping[str, str]) -> dict[str, dict[str, LevelSpec]]:
        table = self._table(self.raw, "factors")
        if mode == "endpoint" and table:
            raise self.fail("endpoint mode maps variants to URLs in [endpoints], not [factors]")
        out: dict[str, dict[str, LevelSpec]] = {}
        for factor, levels in table.items():
            if not _VAR_NAME.match(factor):
                raise self.fail(f"[factors] {factor!r}: a factor name is letters, digits and _")
            if isinstance(levels, list):  # shorthand: levels that add nothing (hook mode)
                levels = {str(lvl): {} for lvl in levels}
            if not isinstance(levels, dict) or not levels:
                raise self.fail(
                    f"[factors.{factor}]: give one table per level, e.g. "
                    f"[factors.{factor}.on] args = [...] env = {{...}}"
                )
            out[factor] = {}
            for level, body in levels.items():
                shown = f'"{level}"' if level == ANY_LEVEL else level
                where = f"[factors.{factor}.{shown}]"
                if not _LEVEL.match(level) and level != ANY_LEVEL:
                    raise self.fail(
                        f"{where}: a level may only hold letters, digits and . _ : + - (or "
                        f'be "{ANY_LEVEL}": any level, filled in for {{level}})'
                    )
                known = {**values, "level": "x"} if level == ANY_LEVEL else values
                if not isinstance(body, dict):
                    raise self.fail(f"{where}: must be a table with 'args' and/or 'env'")
                self._no_unknown(body, {"args", "env", "verify"}, where)
                args = self._str_list(body, "args", where)
                if args and mode != "launch":
                    raise self.fail(f"{where}: 'args' only apply in launch mode; use 'env'")
                for arg in args:
                    self._check_placeholders(arg, known, where)
                env = self._env(body, where, known, allow_port=mode == "launch")
                out[factor][level] = LevelSpec(tuple(args), env, self._verify(body, where))
        return out

    def _verify_tables(self) -> Mapping[str, Mapping[str, Mapping[str, str]]]:
        out: dict[str, Mapping[str, Mapping[str, str]]] = {}
        for factor, levels in self._table(self.raw, "verify").items():
            if not isinstance(levels, dict) or not all(
                isinstance(v, dict) for v in levels.values()
            ):
                raise self.fail(
                    f"[verify.{factor}]: give one table per level, e.g. "
                    f'[verify.{factor}.bf16] "server_info.kv_cache_dtype" = "bf16"'
                )
            out[factor] = MappingProxyType(
                {
                    lvl: self._verify({"verify": body}, f"[verify.{factor}.{lvl}]")
                    for lvl, body in levels.items()
                }  # fmt: skip
            )
        return MappingProxyType(out)

    def _verify(self, body: Mapping[str, Any], where: str) -> Mapping[str, str]:
        table = body.get("verify", {})
        if not isinstance(table, dict):
            raise self.fail(f'{where} verify: give a table of "source.key" = "value"')
        out: dict[str, str] = {}
        for key, value in table.items():
            source, dot, rest = key.partition(".")
            if source not in SOURCES or not dot or not rest:
                raise self.fail(
                    f"{where} verify: {key!r} must be a source and a key joined by a dot, the "
                    f'source one of {", ".join(SOURCES)} (e.g. "server_info.kv_cache_dtype")'
                )
            if isinstance(value, bool):
                value = "true" if value else "false"
            if not isinstance(value, str | int | float):
                raise self.fail(f"{where} verify {key}: give a string, a number or true/false")
            out[key] = str(value)
        return MappingProxyType(out)

    def _launch(self, values: Mapping[str, str]) -> LaunchSpec:
        table = self._table(self.raw, "launch")
        self._no_unknown(table, {"command", "env", "host", "cwd", "stop_grace_s"}, "[launch]")
        command = self._str_list(table, "command", "[launch]")
        if not command:
            raise self.fail(
                "[launch] command: give the server command as a list of arguments, e.g. "
                '["{python}", "-m", "harness.sim", "--port", "{port}"]'
            )
        for arg in command:
            self._check_placeholders(arg, values, "[launch] command")
        if not any("{port}" in a for a in command):
            raise self.fail("[launch] command must contain {port} (the harness picks the port)")
        cwd = table.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise self.fail("[launch] cwd must be a string (relative to the target file)")
        host = self._str(table, "host", "127.0.0.1")
        return LaunchSpec(
            command=tuple(command),
            env=self._env(table, "[launch]", values),
            host=host,
            cwd=(self.path.parent / cwd) if cwd else None,
            stop_grace_s=self._number(table, "stop_grace_s", 30.0, "[launch]"),
        )

    def _hook(self, values: Mapping[str, str]) -> HookSpec:
        table = self._table(self.raw, "hook")
        self._no_unknown(table, {"before", "after", "timeout_s", "env"}, "[hook]")
        before, after = table.get("before"), table.get("after")
        for key, cmd in (("before", before), ("after", after)):
            if cmd is not None and (not isinstance(cmd, str) or not cmd.strip()):
                raise self.fail(f"[hook] {key}: give a shell command as a string")
        if before is None and after is None:
            raise self.fail("[hook]: give a 'before' and/or an 'after' command")
        return HookSpec(
            before=before,
            after=after,
            timeout_s=self._number(table, "timeout_s", 1800.0, "[hook]"),
            env=self._env(table, "[hook]", values, allow_port=False),
        )

    def _endpoints(
        self, values: Mapping[str, str]
    ) -> tuple[tuple[frozenset[tuple[str, str]], str], ...]:
        table = self._table(self.raw, "endpoints")
        if not table:
            raise self.fail(
                "[endpoints]: map each variant label to a base URL, e.g. "
                '"index_k=fp8" = "http://host:30000" (and default = ... with no --ab)'
            )
        out: list[tuple[frozenset[tuple[str, str]], str]] = []
        for label, url in table.items():
            key = self._label_key(label)
            if any(k == key for k, _ in out):
                raise self.fail(f"[endpoints] {label!r} repeats another entry")
            out.append((key, self._url(url, f"[endpoints] {label!r}", values)))
        return tuple(out)

    def _label_key(self, label: str) -> frozenset[tuple[str, str]]:
        if label == "default":
            return frozenset()
        pairs: list[tuple[str, str]] = []
        for part in label.split(","):
            factor, sep, level = part.strip().partition("=")
            if not sep or not _VAR_NAME.match(factor) or not _LEVEL.match(level):
                raise self.fail(
                    f"[endpoints] {label!r}: a key is 'default' or a variant label such as "
                    '"index_k=bf16,hicache=on"'
                )
            pairs.append((factor, level))
        if len({f for f, _ in pairs}) != len(pairs):
            raise self.fail(f"[endpoints] {label!r}: a factor is repeated")
        return frozenset(pairs)

    # -- typed getters --------------------------------------------------------------------

    def _url(self, value: Any, where: str, values: Mapping[str, str]) -> str:
        if not isinstance(value, str) or not re.match(r"^https?://[^\s/]+", value):
            raise self.fail(f'{where}: give a base URL such as "http://127.0.0.1:30000"')
        self._check_placeholders(value, values, where, allow_port=False)
        return substitute(value, values).rstrip("/")

    def _env(
        self,
        table: Mapping[str, Any],
        where: str,
        values: Mapping[str, str],
        *,
        allow_port: bool = True,
    ) -> Mapping[str, str]:
        env = table.get("env", {})
        if not isinstance(env, dict):
            raise self.fail(f'{where} env: give a table of NAME = "value"')
        out: dict[str, str] = {}
        for key, value in env.items():
            if not _ENV_NAME.match(key):
                raise self.fail(f"{where} env: {key!r} is not a valid variable name")
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise self.fail(f"{where} env {key}: give a string or a number")
            self._check_placeholders(
                str(value), values, f"{where} env {key}", allow_port=allow_port
            )
            out[key] = str(value)
        return MappingProxyType(out)

    def _check_placeholders(
        self, text: str, values: Mapping[str, str], where: str, *, allow_port: bool = True
    ) -> None:
        known = set(values) | ({"port", "host", "python"} if allow_port else {"python"})
        for name in placeholders(text):
            ref = ENV_REF.fullmatch(name)
            if ref is not None and ref.group(1) not in os.environ:
                raise self.fail(
                    f"{where}: {{{name}}}: the environment variable {ref.group(1)} is not "
                    "set; export it before the run"
                )
            if name not in known and ref is None:
                raise self.fail(
                    f"{where}: unknown placeholder {{{name}}} in {text!r}; known: "
                    f"{', '.join('{' + k + '}' for k in sorted(known))} and {{env:NAME}} "
                    "(define more in [vars]; write {{ and }} for literal braces)"
                )

    def _table(self, raw: Mapping[str, Any], key: str) -> dict[str, Any]:
        value = raw.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(f"'{key}' must be a table ([{key}])")
        return value

    def _no_unknown(self, table: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
        extra = sorted(set(table) - set(allowed))
        if extra:
            raise self.fail(
                f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
            )

    def _str(self, table: Mapping[str, Any], key: str, default: str) -> str:
        value = table.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"'{key}' must be a string")
        return value

    def _str_list(self, table: Mapping[str, Any], key: str, where: str) -> list[str]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{where} {key}: give a list of strings")
        return list(value)

    def _number(self, table: Mapping[str, Any], key: str, default: float, where: str) -> float:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(f"{where} {key}: give a positive number of seconds")
        return float(value)

    def _bool(self, table: Mapping[str, Any], key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"'{key}' must be true or false")
        return value
