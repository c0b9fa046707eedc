"""Is the workload exercising what it should? The dialect a variant was read with, and
whether a tool workload's sessions got any tool call (per-variant fields of summary.json)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness.labels import PARSER_LEAK

SESSION_KEY = ["variant", "repeat", "session"]

#: a tool workload is not exercising tool calls when at least this share of its sessions
#: got none (every such session ended after its first turn)
NO_TOOL_CALL_WARN = 0.5


def dialect_summary(g: pd.DataFrame) -> dict[str, Any]:
    """The dialect the variant's turns were classified with, and where it came from."""
    if "dialect" not in g or not g["dialect"].notna().any():
        return {}
    counts = g["dialect"].dropna().astype(str).value_counts()
    decided = [d for d in counts.index if d != "auto"]
    out: dict[str, Any] = {
        "dialect": str(decided[0]) if decided else "auto",
        "dialect_turns": {str(d): int(n) for d, n in counts.items()},
    }
    if "dialect_from" in g and g["dialect_from"].notna().any():
        out["dialect_from"] = str(g["dialect_from"].dropna().iloc[0])
    return out


def tool_call_summary(ok: pd.DataFrame) -> dict[str, Any]:
    """How many sessions (and turns) of a tool workload got a tool call at all.

    A turn has a tool call when the server returned one (calls left in the content, a parser
    leak, do not count: nothing runs them, the session ends). Only for the records of a
    ``tools`` workload (the ``workload`` field); a chat workload has none by design.
    """
    if "workload" not in ok or not (ok["workload"] == "tools").any():
        return {}
    ok = ok[ok["workload"] == "tools"]
    if "tool_call_count" in ok:  # a frame read without the text (analysis.turnframe)
        called = ok["tool_call_count"].fillna(0).astype(int) > 0
    elif "tool_calls" in ok:
        called = ok["tool_calls"].map(lambda c: bool(c))
    else:
        called = pd.Series(False, index=ok.index)
    has_call = called & (ok["label"] != PARSER_LEAK)
    per_session = has_call.groupby([ok[k] for k in SESSION_KEY]).any()
    n, without = int(per_session.size), int((~per_session).sum())
    out: dict[str, Any] = {
        "sessions_without_tool_calls": without,
        "tool_call_share": float(has_call.mean()) if len(ok) else None,
    }
    if n and without / n >= NO_TOOL_CALL_WARN:
        leaks = int((ok["label"] == PARSER_LEAK).sum())
        why = (
            f"; {leaks} turns carried tool-call markup in their content (a parser leak: is "
            "the server's tool-call parser on, and the right one?)"
            if leaks
            else "; is the dialect right, and is the server's tool-call parser on?"
        )
        out["warnings"] = [
            f"{without} of {n} sessions got no tool call at all: the tool workload did not "
            f"exercise tool calls{why}"
        ]
    return out


def reasoning_summary(ok: pd.DataFrame) -> dict[str, Any]:
    """Turns whose content carried the model's reasoning (a think block, Harmony's analysis
    channel): judged apart from the answer, never counted as corruption, said once."""
    if "reasoning_in_content" in ok:  # a frame read without the text (analysis.turnframe)
        forms = ok["reasoning_in_content"]
    elif "evidence" in ok:
        forms = ok["evidence"].map(
            lambda e: e.get("reasoning_in_content") if isinstance(e, dict) else None
        )
    else:
        return {}
    if ok.empty:
        return {}
    n = int(forms.notna().sum())
    if not n:
        return {}
    kinds = ", ".join(sorted({str(f) for f in forms.dropna()}))
    return {
        "reasoning_in_content_turns": n,
        "warnings": [
            f"{n} turns carried the model's reasoning in their content ({kinds}): judged apart "
            "from the answer, not counted as corruption; if the server should separate it, "
            "start it with its reasoning parser (SGLang and vLLM: --reasoning-parser NAME)"
        ],
    }


def dialect_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per variant, or one for all when they agree: the dialect and its source."""
    said = [(v["label"], _dialect_text(v)) for v in summary.get("variants", ()) if v.get("dialect")]
    if not said:
        return []
    if len({text for _, text in said}) == 1:
        return [f"tool-call dialect: {said[0][1]}"]
    return [f"tool-call dialect of {label}: {text}" for label, text in said]


def _dialect_text(v: Mapping[str, Any]) -> str:
    source = v.get("dialect_from")
    turns = v.get("dialect_turns") or {}
    where = {"option": "--dialect", "markup": "the first markup"}.get(str(source), f"the {source}")
    text = str(v["dialect"]) + (f" (from {where})" if source else "")
    undecided = turns.get("auto", 0)
    if undecided and v["dialect"] != "auto":
        text += f"; the first {undecided} turns, before any markup, were read as auto"
    return text
