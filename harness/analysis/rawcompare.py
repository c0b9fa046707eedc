"""A chat run against a raw run of one workload: a server parser failure or model corruption?

Running one workload in both modes (``--api chat`` and ``--api completions|generate``) tells
them apart: ``compare_runs`` pairs the turns of the two runs and sorts the differences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness import labels as L
from harness.record.rundir import TURNS_FILE
from harness.record.turns import TurnRecord, read_turns

_KEY = ("variant", "repeat", "session", "turn", "attempt")


def _calls(rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in rec.get("tool_calls") or [] if isinstance(c, Mapping)]


def _empty_args(call: Mapping[str, Any]) -> bool:
    args = call.get("arguments")
    return args in ({}, "", "{}", None)


def judge_pair(chat: Mapping[str, Any], raw: Mapping[str, Any]) -> str:
    """Which side a difference between the same turn in chat and raw mode points at.

    ``server_parser``: the raw text parses clean but the server's answer leaks markup, drops
    calls or empties their arguments. ``model``: the raw text itself is corrupted (whatever
    the server made of it). ``same``: both agree. ``other``: a difference of another kind.
    """
    c_label, r_label = chat.get("label"), raw.get("label")
    if r_label in L.CORRUPTED_LABELS:
        return "model"
    if L.TRANSPORT_ERROR in (c_label, r_label):
        return "other"
    if r_label == L.OK_TOOL_CALL:
        if c_label in (L.PARSER_LEAK, L.MALFORMED_TOOL_CALL, L.INVALID_TOOL_CALL, L.OK_TEXT):
            return "server_parser"
        c_calls, r_calls = _calls(chat), _calls(raw)
        if len(c_calls) < len(r_calls):
            return "server_parser"  # dropped calls
        pairs = zip(c_calls, r_calls, strict=False)
        if any(_empty_args(c) and not _empty_args(r) for c, r in pairs):
            return "server_parser"  # `{}` arguments
    return "same" if c_label == r_label else "other"


def compare_records(chat: Iterable[TurnRecord], raw: Iterable[TurnRecord]) -> dict[str, Any]:
    """Pair the turns of two runs of one workload (same variant, repeat, session, turn,
    attempt) and count what each difference points at."""
    by_key = {tuple(r.get(k) for k in _KEY): r for r in raw}
    verdicts: Counter[str] = Counter()
    pairs: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    unpaired = 0
    for rec in chat:
        key = tuple(rec.get(k) for k in _KEY)
        other = by_key.pop(key, None)
        if other is None:
            unpaired += 1
            continue
        verdict = judge_pair(rec, other)
        verdicts[verdict] += 1
        pairs[f"{rec.get('label')} -> {other.get('label')}"] += 1
        if verdict in ("server_parser", "model") and len(examples) < 20:
            examples.append(
                dict(zip(_KEY, key, strict=True), chat=rec.get("label"), raw=other.get("label"))
            )
    paired = sum(verdicts.values())
    return {
        "paired": paired,
        "unpaired": unpaired + len(by_key),
        "verdict": verdict_text(verdicts, paired),
        "verdicts": dict(verdicts),
        "label_pairs": dict(pairs.most_common()),
        "examples": examples,
    }


def verdict_text(verdicts: Mapping[str, int], paired: int) -> str:
    """One sentence: which side the differences between the two runs point at."""
    parser, model = verdicts.get("server_parser", 0), verdicts.get("model", 0)
    if not paired:
        return "nothing to compare: no turn of one run pairs with a turn of the other"
    said = []
    if parser:
        said.append(
            f"the server's tool-call parser: {parser} of {paired} paired turns parse clean from "
            "the raw text but came back broken from the chat endpoint (markup left in the "
            "content, calls lost, empty arguments)"
        )
    if model:
        said.append(
            f"the model: {model} of {paired} paired turns are corrupted in the raw text itself, "
            "whatever a parser makes of it"
        )
    if said:
        return "; and ".join(said)
    other = verdicts.get("other", 0)
    return (
        f"neither the parser nor the model: {verdicts.get('same', 0)} of {paired} paired turns "
        f"agree, {other} differ otherwise (transport errors, different answers)"
    )


def compare_runs(chat_dir: Path, raw_dir: Path) -> dict[str, Any]:
    """``compare_records`` of two run directories' turns.jsonl."""
    return compare_records(read_turns(chat_dir / TURNS_FILE), read_turns(raw_dir / TURNS_FILE))
