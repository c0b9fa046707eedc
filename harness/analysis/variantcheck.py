"""Whether each variant's server confirms the variant: the rules, the comparison, the warnings.

Reads the rows ``harness.target.serverfacts`` recorded in ``server_facts.jsonl``: ``check``
sets a target file's ``verify`` rules against what a server reported; ``unapplied`` finds two
variants that differ in one factor only but whose servers report the same configuration (for
that factor's rule keys, or all of ``/server_info`` when the factor has no rule): the factor
did not reach the server. ``warnings`` gathers every problem of a run for the summary.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.record.rundir import SERVER_FACTS_FILE

#: Keys that differ between two starts of the same configuration: ports, addresses, process
#: ids, seeds picked at random, time stamps, live counters (matched on the last key segment).
_VOLATILE = re.compile(
    r"(?:^|_)(?:port|ports|pid|host|addr|address|url|seed|time|timestamp|created|uptime"
    r"|throughput|marker)$"
    r"|^(?:internal_states|memory_usage|last_gen_throughput|is_processing|id_task)$"
)

#: How to make each server report cached prompt tokens in ``usage``.
CACHE_REPORT_FLAG = {
    "sglang": "start SGLang with --enable-cache-report",
    "vllm": "start vLLM with --enable-prompt-tokens-details",
    "llamacpp": "use a llama.cpp build that reports usage.prompt_tokens_details",
    "sim": "drop --cache-report off from the simulator's arguments",
}

#: The source that lists every server argument: compared whole when a factor has no rule.
FULL_SOURCE = "server_info"

_MISSING = object()


def lookup(config: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted key (``"props.default_generation_settings.n_ctx"``; a digit
    indexes a list), or ``_MISSING``."""
    node: Any = config
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def matches(actual: Any, expected: str) -> bool:
    """A reported value against the rule's text: booleans as true/false, numbers by value."""
    if actual is _MISSING:
        return False
    if isinstance(actual, bool):
        return expected.lower() == ("true" if actual else "false")
    if isinstance(actual, int | float):
        try:
            return float(expected) == float(actual)
        except ValueError:
            return False
    if isinstance(actual, str):
        return actual == expected
    return json.dumps(actual, sort_keys=True) == expected


def shown(value: Any) -> Any:
    return "(not reported)" if value is _MISSING else value


def check(config: Mapping[str, Any], rules: Mapping[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """Each rule (``key -> (expected, factor)``) against the configuration."""
    out = []
    for key, (expected, factor) in rules.items():
        actual = lookup(config, key)
        out.append(
            {
                "key": key,
                "factor": factor,
                "expected": expected,
                "actual": shown(actual),
                "ok": matches(actual, expected),
            }  # fmt: skip
        )
    return out


def rule_failures(label: str, results: Iterable[Mapping[str, Any]]) -> list[str]:
    return [
        f"variant {label}: the server reports {r['key']} = {r['actual']!r}, the target file "
        f"expects {r['expected']!r} for factor {r['factor']}: the level did not reach the server"
        for r in results
        if not r["ok"]
    ]


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Nested objects -> ``{"a.b": value}``; lists stay values."""
    if not isinstance(doc, Mapping):
        return {prefix: doc}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, Mapping) else {name: value})
    return out


def comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    """What two starts of the same configuration report alike: every source but ``launch``,
    flattened, without the volatile keys."""
    out: dict[str, Any] = {}
    for source, doc in config.items():
        if source == "launch":
            continue
        for key, value in flatten(doc, source).items():
            if not _VOLATILE.search(key.rsplit(".", 1)[-1]):
                out[key] = value
    return out


def _full(flat: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flat.items() if k.startswith(FULL_SOURCE + ".")}


def unapplied(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pairs of variants that differ in one factor only and whose servers report the same
    configuration for it: ``{"factor", "variants", "keys", "message"}``.

    The keys compared are those the ``verify`` rules of that factor name; without rules, all
    of ``/server_info`` (SGLang's lists every server argument; ``/props`` and ``/v1/models``
    show too little to say a factor changed nothing, so only rules judge them)."""
    first: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if comparable(row.get("config") or {}):
            first.setdefault(str(row["variant"]), row)
    found: list[dict[str, Any]] = []
    labels = list(first)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            fa, fb = dict(first[a].get("factors") or {}), dict(first[b].get("factors") or {})
            if set(fa) != set(fb):
                continue
            differ = [f for f in fa if fa[f] != fb[f]]
            if len(differ) != 1:
                continue
            factor = differ[0]
            keys = sorted(
                {
                    r["key"]
                    for row in (first[a], first[b])
                    for r in row.get("verify") or []
                    if r.get("factor") == factor
                }  # fmt: skip
            )
            ca, cb = comparable(first[a]["config"]), comparable(first[b]["config"])
            if keys:
                ra, rb = first[a]["config"], first[b]["config"]
                same = all(lookup(ra, k) == lookup(rb, k) for k in keys)
                what = ", ".join(keys)
            else:  # only a full dump of the server's arguments says a factor changed nothing
                ca, cb = _full(ca), _full(cb)
                if not ca:
                    continue
                same = ca == cb
                what = f"all {len(ca)} settings of its /server_info"
            if same:
                found.append({
                    "factor": factor, "variants": [a, b], "keys": keys,
                    "message": (
                        f"variants {a} and {b} differ only in {factor}, but their servers "
                        f"report the same configuration ({what}): the factor probably does "
                        "not reach the server (an argument or variable it does not read?); "
                        "the comparison of these variants says nothing about it"
                    ),
                })  # fmt: skip
    return found


def load(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / SERVER_FACTS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def warnings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every warning of the facts: failed rules, unapplied factors, failed cache flushes,
    missing cached-token counts (once)."""
    out: list[str] = []
    for row in rows:
        for text in rule_failures(str(row["variant"]), row.get("verify") or []):
            if text not in out:
                out.append(text)
    out += [u["message"] for u in unapplied(rows)]
    for row in rows:
        flush = row.get("flush_cache")
        if isinstance(flush, Mapping) and not flush.get("ok"):
            out.append(
                f"variant {row['variant']} (repeat {row.get('repeat', 0)}): the cache flush "
                f"failed ({flush.get('message')}): its load may not start from an empty cache"
            )
    for row in rows:
        rendering = row.get("rendering")
        if isinstance(rendering, Mapping) and rendering.get("ok") is False:
            out.append(f"variant {row['variant']}: {rendering.get('message')}")
    for row in rows:
        if row.get("cached_tokens_reported") is False:
            out.append(cache_report_warning(row.get("kind")))
            break
    return out


def cache_report_warning(kind: str | None) -> str:
    how = CACHE_REPORT_FLAG.get(kind or "") or (
        "SGLang: --enable-cache-report; vLLM: --enable-prompt-tokens-details"
    )
    return (
        "the server reports no cached prompt tokens (usage.prompt_tokens_details."
        f"cached_tokens): cache statistics will be empty; {how}"
    )


def summary_part(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s ``servers``: the model(s), per variant what its server reported."""
    per: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = per.setdefault(
            str(row["variant"]),
            {"model": row.get("model"), "kind": row.get("kind"), "repeats": []},
        )
        entry["repeats"].append(
            {
                k: row.get(k)
                for k in (
                    "repeat",
                    "base_url",
                    "sources",
                    "verify",
                    "flush_cache",
                    "cached_tokens_reported",
                    "settings",
                )
            }  # fmt: skip
        )
    models = list(dict.fromkeys(str(r["model"]) for r in rows if r.get("model")))
    return {"models": models, "variants": per, "warnings": warnings(rows)}


def settings_of(config: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The reported values of ``keys`` (for the report: what each variant's server said)."""
    return {k: shown(lookup(config, k)) for k in keys}
