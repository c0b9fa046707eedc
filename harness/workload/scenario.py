"""Scenario files (TOML) -> validated, frozen ``Scenario`` objects, with clear errors."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from harness.errors import ConfigError
from harness.tomlfile import read_toml
from harness.workload import passkeys as pk
from harness.workload.dialect import check_name

TOOL_KINDS = ("list_dir", "read_file", "search", "run_tests", "echo")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    dialect: str = "auto"  # a registered dialect name, or "auto" (harness.workload.dialect)
    sessions: int = 80
    steps: int = 26
    max_turns: int = 40
    start_context: int = 2000
    max_context: int = 80000
    max_tokens: int = 1024
    temperature: float = 0.0
    max_attempts: int = 3
    system_prompt: str = ""
    tasks: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = field(default=())
    workload: str = "tools"  # "tools": tool-call turns; "chat": user turns bring documents
    questions: tuple[str, ...] = ()  # chat workload: follow-up questions, cycled
    source: str = "<builtin>"
    # cache-pressure workload (docs/workloads.md); the defaults leave the workload as it was
    pressure: float | None = None  # peak live context of all sessions / the server's KV capacity
    kv_capacity: int | None = None  # KV capacity in tokens when the server does not say
    think_time_s: tuple[float, float] = (0.0, 0.0)  # pause before each next turn, [min, max]
    prefix_groups: int = 0  # sessions sharing a system prompt, in this many groups (0: none)
    branches: int = 1  # sessions per family: the first runs, the others fork from it
    branch_at: int = 0  # the turn at which the forks take the first one's history
    #: requests in flight at most when the command line does not say (0: one per session);
    #: a scenario for a server with few slots keeps the queue short enough for its timeouts
    concurrency: int = 0
    #: more sampling fields sent with every request, as the server names them (a penalty
    #: that keeps a small model from looping: ``repeat_penalty``, ``frequency_penalty``)
    sampling: tuple[tuple[str, Any], ...] = ()
    passkeys: bool = False  # --passkeys: plant an id early, ask it back (workload.passkeys)
    #: --oracle spec_accept: ask SGLang for its per-request meta_info (speculative counters)
    return_meta_info: bool = False
    #: --oracle replay: ask for the generated token ids (``return_token_ids``; non-streamed
    #: also ``logprobs`` with one top entry, where llama.cpp gives the ids), compared by token
    return_token_ids: bool = False

    def openai_tools(self) -> list[dict[str, Any]]:
        tools = [t.openai() for t in self.tools]
        if self.passkeys and tools:  # the tool the passkey is asked back through
            tools.append(pk.OPENAI_TOOL)
        return tools

    def with_overrides(self, **changes: Any) -> Scenario:
        clean = {k: v for k, v in changes.items() if v is not None}
        out = replace(self, **clean)
        _check_numbers(out, out.source)
        return out


_INT_FIELDS = (
    "sessions",
    "steps",
    "max_turns",
    "start_context",
    "max_context",
    "max_tokens",
    "max_attempts",
)
WORKLOADS = ("tools", "chat")
_PRESSURE_KEYS = ("pressure", "kv_capacity", "think_time_s", "prefix_groups", "branches",
                  "branch_at")  # fmt: skip
_KNOWN = {
    *_PRESSURE_KEYS,
    "workload",
    "questions",
    "name",
    "description",
    "dialect",
    "system_prompt",
    "tasks",
    "tools",
    "temperature",
    "concurrency",
    "sampling",
    *_INT_FIELDS,
}


def default_scenario_path() -> Path:
    """The scenario shipped with the project (scenarios/coding_agent.toml)."""
    here = Path(__file__).resolve().parents[2] / "scenarios" / "coding_agent.toml"
    if here.exists():
        return here
    packaged = resources.files("harness") / "data" / "coding_agent.toml"
    return Path(str(packaged))


def load_scenario(path: Path | None = None) -> Scenario:
    path = path or default_scenario_path()
    raw = read_toml(path, "scenario")
    return parse_scenario(raw, str(path))


def parse_scenario(raw: dict[str, Any], source: str) -> Scenario:
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)}; "
            f"known keys: {', '.join(sorted(_KNOWN))}"
        )
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ConfigError(f"{source}: 'name' must be a non-empty string")
    dialect = raw.get("dialect", "auto")
    if not isinstance(dialect, str):
        raise ConfigError(f"{source}: 'dialect' must be a string, got {dialect!r}")
    dialect = check_name(dialect, source)
    tasks = raw.get("tasks", ["Investigate the repository. Work in about {steps} steps."])
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ConfigError(f"{source}: 'tasks' must be a non-empty list of strings")
    workload = raw.get("workload", "tools")
    if workload not in WORKLOADS:
        raise ConfigError(f"{source}: workload {workload!r} is not one of {', '.join(WORKLOADS)}")
    questions = raw.get("questions", ["Summarize what the new document adds."])
    if not isinstance(questions, list) or not all(isinstance(q, str) for q in questions):
        raise ConfigError(f"{source}: 'questions' must be a list of strings")
    tools = tuple(_parse_tool(t, i, source) for i, t in enumerate(raw.get("tools", [])))
    if workload == "tools" and not tools:
        raise ConfigError(f"{source}: a 'tools' workload needs at least one [[tools]] entry")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: tool names must be unique, got {names}")
    kwargs: dict[str, Any] = {k: raw[k] for k in _INT_FIELDS if k in raw}
    for key, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be an integer, got {value!r}")
    concurrency = raw.get("concurrency", 0)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0:
        raise ConfigError(
            f"{source}: 'concurrency' must be a whole number of requests (0: one per session), "
            f"got {concurrency!r}"
        )
    sampling = _sampling(raw.get("sampling", {}), source)
    temperature = raw.get("temperature", 0.0)
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise ConfigError(f"{source}: 'temperature' must be a number in [0, 2]")
    scenario = Scenario(
        **_pressure_keys(raw, source),
        name=raw["name"],
        description=str(raw.get("description", "")),
        dialect=dialect,
        system_prompt=str(raw.get("system_prompt", "")),
        tasks=tuple(tasks),
        tools=tools,
        workload=workload,
        questions=tuple(questions),
        temperature=float(temperature),
        concurrency=concurrency,
        sampling=sampling,
        source=source,
        **kwargs,
    )
    _check_numbers(scenario, source)
    return scenario


#: request fields the scenario sets by its own keys (or the harness does): not in [sampling]
_OWN_FIELDS = ("messages", "model", "stream", "tools", "temperature", "max_tokens", "seed")


def _sampling(raw: Any, source: str) -> tuple[tuple[str, Any], ...]:
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: 'sampling' must be a table, e.g. [sampling] repeat_penalty = 1.15"
        )
    for key, value in raw.items():
        if key in _OWN_FIELDS:
            raise ConfigError(
                f"{source}: [sampling] {key}: set by the scenario's own keys or by the harness; "
                "leave it out of [sampling]"
            )
        if not isinstance(value, int | float | str | bool):
            raise ConfigError(f"{source}: [sampling] {key}: give a number, a string or a boolean")
    return tuple(sorted(raw.items()))


def _pressure_keys(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The cache-pressure keys present in ``raw``, type-checked (ranges: _check_numbers)."""
    out: dict[str, Any] = {}
    if "pressure" in raw:
        value = raw["pressure"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{source}: 'pressure' must be a number, e.g. 1.5, got {value!r}")
        out["pressure"] = float(value)
    for key in ("kv_capacity", "prefix_groups", "branches", "branch_at"):
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{source}: '{key}' must be an integer, got {value!r}")
            out[key] = value
    if "think_time_s" in raw:
        value = raw["think_time_s"]
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = [value, value]
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        ):
            raise ConfigError(
                f"{source}: 'think_time_s' must be [min, max] in seconds, e.g. [2, 8], "
                f"got {value!r}"
            )
        out["think_time_s"] = (float(value[0]), float(value[1]))
    return out


def _check_pressure(s: Scenario, source: str) -> None:
    if s.pressure is not None and not s.pressure > 0:
        raise ConfigError(f"{source}: 'pressure' must be above 0 (e.g. 1.5), got {s.pressure}")
    if s.kv_capacity is not None and s.kv_capacity < 1:
        raise ConfigError(f"{source}: 'kv_capacity' must be at least 1 token, got {s.kv_capacity}")
    lo, hi = s.think_time_s
    if lo < 0 or hi < lo:
        raise ConfigError(
            f"{source}: 'think_time_s' must be [min, max] with 0 <= min <= max, got [{lo}, {hi}]"
        )
    if s.prefix_groups < 0:
        raise ConfigError(f"{source}: 'prefix_groups' must be 0 or more, got {s.prefix_groups}")
    if s.branches < 1:
        raise ConfigError(f"{source}: 'branches' must be at least 1, got {s.branches}")
    if s.branches > 1 and not 1 <= s.branch_at < s.max_turns:
        raise ConfigError(
            f"{source}: 'branch_at' must be a turn from 1 to max_turns - 1 ({s.max_turns - 1}) "
            f"when 'branches' is above 1, got {s.branch_at}"
        )


def _check_numbers(s: Scenario, source: str) -> None:
    _check_pressure(s, source)
    for key in _INT_FIELDS:
        if getattr(s, key) < 1:
            raise ConfigError(f"{source}: '{key}' must be at least 1, got {getattr(s, key)}")
    if s.max_context <= s.start_context:
        raise ConfigError(
            f"{source}: max_context ({s.max_context}) must be larger than start_context "
            f"({s.start_context})"
        )


def _parse_tool(raw: Any, index: int, source: str) -> ToolSpec:
    where = f"{source}: tools[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table with name, kind, description, parameters")
    name = raw.get("name")
    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise ConfigError(f"{where}: 'name' must be an identifier, got {name!r}")
    kind = raw.get("kind", name)
    if kind not in TOOL_KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(TOOL_KINDS)}")
    params = raw.get("parameters", {"type": "object", "properties": {}})
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as exc:
        raise ConfigError(
            f"{where}: 'parameters' is not a valid JSON schema: {exc.message}"
        ) from None
    if params.get("type") != "object":
        raise ConfigError(f"{where}: 'parameters' must be a schema of type 'object'")
    return ToolSpec(
        name=name, kind=kind, description=str(raw.get("description", "")), parameters=params
    )
