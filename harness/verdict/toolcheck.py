"""Check tool calls against the declared tools: names, strict JSON, JSON schemas.

``check_server_calls`` takes a server's OpenAI-shaped ``tool_calls`` (``{"function":
{"name", "arguments": str}}`` or ``{"name", "arguments"}``): a server's calls are evidence,
not the truth (servers pass unknown names on, turn a malformed parameter into ``{}``,
concatenate argument objects). ``check_calls`` takes calls parsed from raw text.
``tools=None`` means "not declared": names and schemas are then not checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from jsonschema import exceptions as js_exceptions
from jsonschema import validators
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable

from harness.dialects.base import ToolCall
from harness.dialects.jsonstrict import StrictJSONError, loads_strict
from harness.errors import UsageError

UNKNOWN_TOOL = "unknown_tool"
MISSING_NAME = "missing_name"
INVALID_JSON = "invalid_json"
DUPLICATE_KEY = "duplicate_key"
CONCATENATED_JSON = "concatenated_json"
NOT_AN_OBJECT = "not_an_object"
SCHEMA = "schema"


@dataclass(frozen=True)
class Problem:
    kind: str
    message: str
    index: int  # which call (0-based)
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: key of a schema -> its validator, or the reason it cannot be used (a string)
_VALIDATORS: dict[str, Any] = {}
#: the validator of a schema object seen before (a run's tools are the same objects every turn:
#: no need to encode the schema again to find its validator); the schema is kept, so its id
#: is not reused while it is here
_BY_ID: dict[int, tuple[Mapping[str, Any], Any]] = {}


def _refuse(uri: str) -> Resource[Any]:
    """The registry's retrieval of a ``$ref`` the schema does not hold: never fetched."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_NO_NETWORK: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]


def remote_refs(schema: Any) -> list[str]:
    """The ``$ref`` values of ``schema`` that point outside it (not ``#...``)."""
    found: list[str] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                found.append(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(set(found))


def _validator(schema: Mapping[str, Any]) -> Any:
    """The schema's validator, or a string saying why it cannot be used (a schema the
    validator rejects, a remote ``$ref``: the classifier never goes on the network)."""
    seen = _BY_ID.get(id(schema))
    if seen is not None and seen[0] is schema:
        return seen[1]
    key = json.dumps(schema, sort_keys=True, default=str)
    validator = _VALIDATORS.get(key)
    if validator is None:
        cls = validators.validator_for(schema)
        remote = remote_refs(schema)
        try:
            cls.check_schema(schema)
        except js_exceptions.SchemaError as exc:
            validator = f"is not a valid JSON schema ({exc.message})"
        else:
            if remote:
                validator = (
                    f"refers to a remote schema ({', '.join(remote)}), which is never fetched"
                )
            else:
                validator = cls(schema, registry=_NO_NETWORK)
        _VALIDATORS[key] = validator
    if len(_BY_ID) >= 256:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, validator)
    return validator


def schema_problems(tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """Why some declared schemas cannot be used (their calls' arguments go unchecked)."""
    if not tools:
        return []
    out = []
    for name, schema in tool_schemas(tools).items():
        if schema is not None and isinstance(why := _validator(schema), str):
            fix = (
                "; put the definitions in the schema ($defs) and refer to them with '#/...'"
                if "remote" in why
                else ""
            )
            out.append(f"the parameters schema of tool {name!r} {why}: its arguments are not "
                       f"checked{fix}")  # fmt: skip
    return out


def tool_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any] | None]:
    """name -> parameters schema (None: any object) for OpenAI or bare tool definitions."""
    out: dict[str, Mapping[str, Any] | None] = {}
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise UsageError(f"a tool definition needs a function name: {tool!r}")
        params = fn.get("parameters")
        out[fn["name"]] = params if isinstance(params, Mapping) else None
    return out


def _check_args(
    index: int,
    name: str,
    args: Any,
    schemas: dict[str, Mapping[str, Any] | None] | None,
) -> list[Problem]:
    if not isinstance(args, dict):
        return [Problem(NOT_AN_OBJECT, "arguments are not a JSON object", index, name)]
    if schemas is None:
        return []
    if name not in schemas:
        return [Problem(UNKNOWN_TOOL, f"tool {name!r} is not declared", index, name)]
    schema = schemas[name]
    if schema is None:
        return []
    validator = _validator(schema)
    if isinstance(validator, str):
        return []  # the schema cannot be used: schema_problems() says why
    try:
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
    except Unresolvable:
        return []  # a local "#/..." pointer to nothing: the schema's fault, not the call's
    return [
        Problem(SCHEMA, f"{'/'.join(map(str, e.path)) or '(arguments)'}: {e.message}", index, name)
        for e in errors[:5]
    ]


def check_server_calls(
    tool_calls: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[Problem]:
    """Problems with a server's ``tool_calls`` (an empty list: all calls are valid)."""
    schemas = tool_schemas(tools) if tools is not None else None
    problems: list[Problem] = []
    for i, call in enumerate(tool_calls):
        fn = call.get("function", call)
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            problems.append(Problem(MISSING_NAME, "tool call without a name", i))
            continue
        raw = fn.get("arguments")
        if isinstance(raw, str) and raw.strip() == "":
            # no arguments: what several servers send for a call that has none (a tool
            # without parameters); checked as {} against the schema, so a call whose tool
            # requires arguments still fails (a server that lost them)
            raw = {}
        if isinstance(raw, str):
            try:
                args = loads_strict(raw)
            except StrictJSONError as exc:
                kind = {"duplicate_key": DUPLICATE_KEY, "concatenated_json": CONCATENATED_JSON}
                problems.append(
                    Problem(kind.get(exc.kind, INVALID_JSON), f"arguments: {exc.message}", i, name)
                )
                continue
        else:
            args = raw
        problems.extend(_check_args(i, name, args, schemas))
    return problems


def check_calls(
    calls: Sequence[ToolCall], tools: Sequence[Mapping[str, Any]] | None
) -> list[Problem]:
    """Problems with calls parsed from raw text (their JSON was already checked)."""
    schemas = tool_schemas(tools) if tools is not None else None
    problems: list[Problem] = []
    for i, call in enumerate(calls):
        problems.extend(_check_args(i, call.name, call.arguments, schemas))
    return problems


def server_calls_as_dicts(tool_calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"name", "arguments"}]`` with arguments as objects where they parse, else raw."""
    out = []
    for call in tool_calls:
        fn = call.get("function", call)
        raw = fn.get("arguments")
        args: Any = raw
        if isinstance(raw, str):
            try:
                args = loads_strict(raw)
            except StrictJSONError:
                args = raw
        out.append({"name": fn.get("name"), "arguments": args})
    return out
