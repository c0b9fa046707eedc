"""Targets: how each factor level becomes a server configuration (``TargetSpec``; read from
a target file by ``harness.target.targetfile``).

Three modes (see docs/targets.md):

* ``launch``   -- a command template (argv, no shell) started per variant; each factor level
  adds arguments and environment variables.
* ``endpoint`` -- each variant label maps to a base URL that is already up.
* ``hook``     -- shell commands run before and after each variant, then a readiness wait on
  one base URL. Factor levels reach the hooks only as environment variables.

A factor level is a value that selects an entry of the file: it is never substituted into a
command. A level the file does not define is a usage error naming the file, the factor and the
levels the file defines.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from harness.errors import ConfigError, UsageError
from harness.record.rundir import MASK
from harness.workload.matrix import Variant

MODES = ("launch", "endpoint", "hook")
#: ``[factors.<name>."*"]``: any level, its value filled in for ``{level}`` (an engine's
#: version: ``--ab llamacpp=0.1.11,0.1.12`` without a table per release)
ANY_LEVEL = "*"
READINESS_PATHS = ("/health_generate", "/health", "/v1/models")
#: Placeholders the harness fills in itself; ``[vars]`` adds more.
BUILTIN_VARS = ("port", "host", "python", "model")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


@dataclass(frozen=True)
class LevelSpec:
    """What one factor level adds: launch arguments and environment variables; ``verify``
    is what the server must report once it runs this level (``"server_info.kv_cache_dtype"
    -> "fp8_e4m3"``, see harness.target.serverfacts)."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    verify: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


#: How long a server the harness did not start may refuse connections before that is said
#: (it may have been started a moment ago); ``--ready-timeout`` waits longer.
REFUSED_GRACE_S = 2.0


@dataclass(frozen=True)
class ReadySpec:
    """When a server is ready: the first of ``paths`` answering 200, polled every
    ``interval_s`` for at most ``timeout_s``; a server already up that refuses connections
    for ``refused_s`` is said to be down (a server the harness starts is waited on)."""

    paths: tuple[str, ...] = READINESS_PATHS
    timeout_s: float = 600.0
    interval_s: float = 2.0
    refused_s: float = REFUSED_GRACE_S

    def waiting(self, timeout_s: float) -> ReadySpec:
        """The same with ``--ready-timeout``: every wait, a closed port's too, this long."""
        return replace(self, timeout_s=timeout_s, refused_s=timeout_s)


#: ``--endpoint URL``: a server already up answers at once (503 while it loads a model is
#: waited on this long).
ENDPOINT_READY = ReadySpec(timeout_s=10.0, interval_s=0.2)


@dataclass(frozen=True)
class LaunchSpec:
    command: tuple[str, ...]
    env: Mapping[str, str]
    host: str = "127.0.0.1"
    cwd: Path | None = None
    stop_grace_s: float = 30.0


@dataclass(frozen=True)
class HookSpec:
    before: str | None
    after: str | None
    timeout_s: float = 1800.0
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class TargetSpec:
    """A validated target file. ``factors[name][level]`` is what that level adds."""

    path: Path
    name: str
    mode: str
    description: str
    model: str
    served_model: str | None
    vars: Mapping[str, str]
    ready: ReadySpec
    factors: Mapping[str, Mapping[str, LevelSpec]]
    launch: LaunchSpec | None = None
    hook: HookSpec | None = None
    base_url: str | None = None
    #: endpoint mode: (factor pairs of a variant, base URL); ``frozenset()`` is the default
    endpoints: tuple[tuple[frozenset[tuple[str, str]], str], ...] = ()
    warm_up: bool = True
    flush_cache: bool = False
    metrics: bool = True
    #: the server runs in a deterministic mode (a request alone gives exactly what it gives in
    #: a batch): ``--oracle replay`` compares exactly (harness.run.oracle_replay)
    deterministic: bool = False
    #: launch mode, ``[alone] args``: added to a variant's command for a fresh server that
    #: takes requests one at a time; its flagged turns are re-sent there after the load
    #: (harness.run.afterload). None: no such server (re-sent on the loaded one with --confirm)
    alone_args: tuple[str, ...] | None = None
    #: ``[verify.<factor>.<level>]`` tables (any mode): what the server reports at that level
    verify: Mapping[str, Mapping[str, Mapping[str, str]]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def rules_for(self, variant: Variant) -> dict[str, tuple[str, str]]:
        """``"source.key"`` -> (expected value, the factor that sets it) for ``variant``: its
        levels' ``verify`` and the ``[verify]`` tables' entries for its levels."""
        out: dict[str, tuple[str, str]] = {}
        for factor, level in variant.factors:
            entry = self.level_spec(factor, level)
            for key, value in (entry.verify if entry is not None else {}).items():
                out[key] = (value, factor)
            for key, value in self.verify.get(factor, {}).get(level, {}).items():
                out[key] = (value, factor)
        return out

    def level_spec(self, factor: str, level: str) -> LevelSpec | None:
        """What ``factor=level`` adds: its own table, else the factor's ``"*"`` table with
        ``{level}`` filled in (a level is letters, digits and ``. _ : + -`` only)."""
        levels = self.factors.get(factor, {})
        if level in levels:
            return levels[level]
        pattern = levels.get(ANY_LEVEL)
        if pattern is None:
            return None

        def fill(text: str) -> str:
            return text.replace("{level}", level)

        return LevelSpec(
            tuple(fill(a) for a in pattern.args),
            MappingProxyType({k: fill(v) for k, v in pattern.env.items()}),
            MappingProxyType({k: fill(v) for k, v in pattern.verify.items()}),
        )

    def levels(self, factor: str) -> tuple[str, ...]:
        """The levels the file defines for ``factor`` (empty if it defines none)."""
        if self.mode == "endpoint":
            found = {lvl for key, _ in self.endpoints for f, lvl in key if f == factor}
            return tuple(sorted(found))
        return tuple(self.factors.get(factor, {}))

    def factor_names(self) -> tuple[str, ...]:
        if self.mode == "endpoint":
            return tuple(sorted({f for key, _ in self.endpoints for f, _ in key}))
        return tuple(self.factors)

    def check_variant(self, variant: Variant) -> None:
        """Raise UsageError if the file does not define every level of ``variant``."""
        for factor, level in variant.factors:
            defined = self.levels(factor)
            if not defined:
                known = ", ".join(self.factor_names()) or "none"
                raise UsageError(
                    f"{self.path}: factor {factor!r} is not defined in this target file "
                    f"(it defines factors: {known}); add a [factors.{factor}.<level>] table "
                    "or drop it from --ab"
                )
            if level not in defined and ANY_LEVEL not in defined:
                raise UsageError(
                    f"{self.path}: factor {factor!r} has no level {level!r} "
                    f"(levels defined: {', '.join(defined)})"
                )
        if self.mode == "endpoint":
            self.endpoint_for(variant)

    def endpoint_for(self, variant: Variant) -> str:
        """Endpoint mode: the base URL of ``variant`` (exact match of its factor pairs)."""
        want = frozenset(variant.factors)
        for key, url in self.endpoints:
            if key == want:
                return url
        defined = ", ".join(_key_label(k) for k, _ in self.endpoints)
        raise UsageError(
            f"{self.path}: no endpoint for variant {variant.label!r}; the [endpoints] table "
            f"defines: {defined}"
        )


def _key_label(key: frozenset[tuple[str, str]]) -> str:
    return ",".join(f"{f}={lvl}" for f, lvl in sorted(key)) or "default"


#: names of values that are kept off disk and off the terminal (``***`` wherever the harness
#: writes or prints them): a key, a token, a secret, a password, a credential
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)
ENV_REF = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET.search(name))


def shown_values(values: Mapping[str, str]) -> dict[str, str]:
    """``values`` for display: those of secret-looking names masked."""
    return {k: (MASK if v and is_secret_name(k) else v) for k, v in values.items()}


def substitute(text: str, values: Mapping[str, str], *, reveal: bool = True) -> str:
    """Fill ``{name}`` placeholders; ``{{``/``}}`` are literal braces. Unknown -> KeyError.

    ``{env:NAME}`` is the environment variable NAME, read now (ConfigError when it is not
    set); with ``reveal=False`` (what is written or printed) it stays ``{env:NAME}``."""

    def repl(m: re.Match[str]) -> str:
        whole = m.group(0)
        if whole == "{{":
            return "{"
        if whole == "}}":
            return "}"
        ref = ENV_REF.fullmatch(m.group(1))
        if ref is None:
            return values[m.group(1)]
        if not reveal:
            return whole
        if ref.group(1) not in os.environ:
            raise ConfigError(
                f"{whole} in the target file: the environment variable {ref.group(1)} is "
                "not set; export it before the run"
            )
        return os.environ[ref.group(1)]

    return _PLACEHOLDER.sub(repl, text)


def placeholders(text: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(text) if m.group(1) is not None}
