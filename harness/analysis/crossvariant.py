"""The same request answered by two variants: an answer cut short against the other's.

With greedy sampling and a seeded workload, every variant of a run sends the same first
request of each session, and the same later ones for as long as the earlier answers were the
same. Two healthy builds of an engine give the same answer to the same request, or answers
that part somewhere and go on, each at its own length. A damaged one gives short junk
("This wisinggesmol found its prime minister." where the other wrote 300 tokens), a lone
word, or stops half-way: text the detector passes (it reads as words) and that only a
reference shows. So each turn whose request both variants sent (their sessions agreed on
every earlier answer) is compared:

- an answer is **cut short** (``CUT_SHORT``) when it ended by itself (``finish_reason``
  stop), is under ``SHORT_SHARE`` of the other variant's answer, and the other's has at least
  ``MIN_REFERENCE_CHARS`` characters. Such a turn is corrupted, tier ``confirmed``
  (``confirmed_by`` names the reference), whatever the detector said of it;
- an answer byte for byte the same as the other variant's (``SAME``) is what the model
  itself writes for that request: a suspect of the detector among them (a small model's own
  loop at temperature 0) is acquitted. A race in a cache does not write the same bytes on
  two servers; the parsers' structural findings are exact and stay.

Only where the run sampled greedily (``temperature`` 0 in run.json): two samples of one
request differ by design. The first differing answer of a session ends its comparison (the
next requests differ). ``cut_short(a, b)`` is the rule for two answers; ``evidence`` applies
it to a run's turns, each variant against every other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import permutations
from typing import Any

from harness.analysis.turnframe import digest

SHORT_SHARE = 0.35  # an answer under this share of the other's length is cut short
MIN_REFERENCE_CHARS = 200  # ... when the other's has at least this many characters

Key = tuple[Any, ...]  # (variant, repeat, session, turn, attempt), as in turns.jsonl
CUT_SHORT, SAME = "cut_short", "same"


#: what a reference answer may be labelled: a healthy answer (one cut at max_tokens too); a
#: flagged one (a corrupted build's long loop) is no yardstick for the other's length
REFERENCE_LABELS = frozenset({"ok_text", "ok_tool_call", "truncated"})


def cut_short(answer: Mapping[str, Any], reference: Mapping[str, Any]) -> bool:
    """Whether ``answer`` stopped by itself far shorter than ``reference`` (same request),
    a healthy answer."""
    mine, theirs = _shape(answer), _shape(reference)
    if mine == theirs or answer.get("finish_reason") != "stop":
        return False
    if reference.get("label") not in REFERENCE_LABELS:
        return False
    return theirs[0] >= MIN_REFERENCE_CHARS and mine[0] < SHORT_SHARE * theirs[0]


def _shape(row: Mapping[str, Any]) -> tuple[int, str]:
    """The stripped answer's length and digest: from its content, or from what a frame read
    without the text keeps of it (``content_chars``, ``content_digest``:
    analysis.turnframe)."""
    content = row.get("content")
    if isinstance(content, str) and (content or not isinstance(row.get("content_digest"), str)):
        return len(content.strip()), digest(content)
    chars, key = row.get("content_chars"), row.get("content_digest")
    if isinstance(key, str) and isinstance(chars, int | float) and chars == chars:
        return int(chars), key
    return 0, digest("")


def _final_sends(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[tuple[Any, ...], Any]]:
    """variant -> (repeat, session) -> turn -> the turn's last send."""
    out: dict[str, dict[tuple[Any, ...], Any]] = {}
    for r in rows:
        turns = out.setdefault(str(r.get("variant")), {}).setdefault(
            (r.get("repeat") or 0, r.get("session")), {}
        )
        turn = r.get("turn") or 0
        if turn not in turns or (r.get("attempt") or 0) >= (turns[turn].get("attempt") or 0):
            turns[turn] = r
    return out


def _answered(row: Mapping[str, Any] | None) -> bool:
    """An answer came back (a row read by pandas has NaN where a field is empty)."""
    if row is None:
        return False
    if not isinstance(row.get("content"), str) and not isinstance(row.get("content_digest"), str):
        return False
    failure = row.get("transport_error")
    return not (isinstance(failure, str) and failure)


def evidence(rows: Iterable[Mapping[str, Any]]) -> dict[Key, tuple[str, str]]:
    """For each send compared with another variant's answer to the same request: ``CUT_SHORT``
    or ``SAME``, and the label of that variant (a cut found against any variant wins)."""
    sends = _final_sends(rows)
    out: dict[Key, tuple[str, str]] = {}
    for mine, theirs in permutations(sorted(sends), 2):
        for session, turns in sends[mine].items():
            others = sends[theirs].get(session, {})
            for turn in sorted(turns):
                a, b = turns[turn], others.get(turn)
                if not (_answered(a) and _answered(b)):
                    break
                key = (mine, a.get("repeat") or 0, a.get("session"), turn, a.get("attempt") or 0)
                same = _shape(a) == _shape(b)
                if cut_short(a, b):
                    out[key] = (CUT_SHORT, theirs)
                elif same and key not in out:
                    out[key] = (SAME, theirs)
                if not same:
                    break  # the next requests differ
    return out
