"""Token salad and repetition in one model output: a windowed score and where it starts.

Every signal produces events ``(offset, weight)``; a window whose weights reach THRESHOLD is
corrupted.
The score is the largest sum of event weights inside any window of ``WINDOW`` characters
(each signal capped per window, so one weak signal cannot reach the threshold by itself),
so a long clean prefix does not dilute a corrupted tail, and the offset is the first event of
the first window that reaches the threshold. The signals and their weights are described in
docs/detector.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from harness.verdict import repeat, salad, scripts
from harness.verdict.masking import Masked, mask

THRESHOLD = 0.7
WINDOW = 320  # characters
CODE_WEIGHT = 0.6  # salad events inside fenced or indented code

TOKEN_SALAD = "token_salad"
REPETITION = "repetition"

#: Per-window caps of the weak signals.
_CAPS = {
    "identifier_soup": 1.2,
    "stutter": 0.6,
    "glued_punctuation": 0.8,
    "stray_symbol": 1.2,
    "script_variety": 0.45,
}
_REPETITION_SIGNALS = frozenset({"loop", "drift", "char_run", "special_token_run", "stutter_run"})
_SIGNALS = (
    "special_token",
    "special_token_run",
    "replacement_char",
    "char_run",
    "symbol_soup",
    "glued_punctuation",
    "stray_symbol",
    "identifier_soup",
    "stutter",
    "script_switch",
    "script_variety",
    "loop",
    "drift",
    "tool_value",
)
#: Signals that describe prose; code legitimately has "?;", "parseHTML", "aa aa".
_PROSE_ONLY = frozenset({"glued_punctuation", "stray_symbol", "identifier_soup", "stutter"})
_GAP = re.compile(r"\s*")


@dataclass(frozen=True)
class TextFinding:
    label: str | None  # "token_salad" | "repetition" | None (clean)
    score: float  # combined score; >= THRESHOLD means corrupted
    offset: int | None  # character offset where the corruption starts
    signals: dict[str, float]  # per-signal scores in the worst window (for evidence)


CLEAN = TextFinding(None, 0.0, None, {})


def _unescape(text: str) -> str:
    """Outputs pasted as string literals: literal backslash-n as a line break, same length."""
    n = text.count("\\n")
    if n >= 2 and n > text.count("\n"):
        return text.replace("\\n", " \n").replace("\\t", " \t").replace("\\r", " \r")
    return text


def score_text(text: str, context: str | None = None) -> TextFinding:
    if not text or text.isspace():
        return CLEAN
    work = _unescape(text)
    m = mask(work)
    ev: list[tuple[int, float, str]] = []
    _special(work, m, ev)
    ev.extend(salad.events(m.loops, work.isascii()))
    if not m.loops.isascii():
        ids = scripts.script_ids(m.loops)
        pos, w = scripts.switch_events(ids)
        ev.extend(zip(pos.tolist(), w.tolist(), ["script_switch"] * pos.size, strict=True))
        pos, w = scripts.variety_events(ids)
        ev.extend(zip(pos.tolist(), w.tolist(), ["script_variety"] * pos.size, strict=True))
    if m.code and ev:  # salad inside code counts, but code is noisy: less weight
        where = m.in_code(np.array([e[0] for e in ev], dtype=np.int64))
        ev = [
            (p, w * CODE_WEIGHT, s) if c else (p, w, s)
            for (p, w, s), c in zip(ev, where, strict=True)
            if not (c and s in _PROSE_ONLY)
        ]
    _loops(m.loops, context, m.code, ev)
    for vs, ve in m.values:
        sub = score_text(work[vs:ve], context)
        if sub.label is not None and sub.offset is not None:
            sig = "loop" if sub.label == REPETITION else "tool_value"
            ev.append((vs + sub.offset, sub.score, sig))
    if not ev:
        return CLEAN
    return _combine(ev)


def _special(text: str, m: Masked, ev: list[tuple[int, float, str]]) -> None:
    """Special-token debris; a run of the same token is a loop, not just debris.

    Searched in the whole text (debris inside a tool-call argument is still debris) except
    quoted code spans, where documentation legitimately shows template tokens.
    """
    if "<" not in text and "[" not in text:
        return
    run_start, run_tok, run_end, count = -1, "", -1, 0
    found = [f for f in salad.special_tokens(text) if not m.quoted_at(f[0])]
    html_s = "<s>" in text and "</s>" in text  # strike-through markup, not BOS/EOS
    if html_s:
        found = [f for f in found if f[2] not in ("<s>", "</s>")]
    found.append((len(text) + 1, len(text) + 1, "\0"))
    for s, e, tok in found:
        if tok == run_tok and _GAP.fullmatch(text, run_end, s):
            count += 1
            run_end = e
            continue
        if count:
            ev.append((run_start, 1.0, "special_token"))
            if count >= 3:
                ev.append((run_start, (count - 1) / 2, "special_token_run"))
        run_start, run_tok, run_end, count = s, tok, e, 1


def _loops(
    text: str,
    context: str | None,
    code: tuple[tuple[int, int], ...],
    ev: list[tuple[int, float, str]],
) -> None:
    tokens = repeat.tokens_of(text)
    ctx = repeat.tokens_of(context) if context else None
    loops = repeat.find_loops(tokens, ctx)
    if not loops:
        return
    loops = loops[:8]
    starts = repeat.token_starts(text, max(lp.start for lp in loops) + 1)
    for lp in loops:
        pos = starts[min(lp.start, len(starts) - 1)]
        score = lp.score
        if any(s <= pos < e for s, e in code):
            score *= 0.5
        ev.append((pos, score, lp.kind))


def _combine(ev: list[tuple[int, float, str]]) -> TextFinding:
    ev.sort()
    pos = np.array([e[0] for e in ev], dtype=np.int64)
    names = [e[2] for e in ev]
    starts = np.unique(pos)
    ends = starts + WINDOW
    per: dict[str, np.ndarray] = {}
    for sig in set(names):
        sel = np.array([n == sig for n in names])
        p = pos[sel]
        c = np.concatenate(([0.0], np.cumsum([e[1] for e, k in zip(ev, sel, strict=True) if k])))
        sums = c[np.searchsorted(p, ends, side="left")] - c[np.searchsorted(p, starts, "left")]
        per[sig] = np.minimum(sums, _CAPS.get(sig, np.inf))
    total = np.sum(list(per.values()), axis=0)
    best = int(np.argmax(total))
    score = float(total[best])
    hit = np.flatnonzero(total >= THRESHOLD)
    offset = int(starts[hit[0]]) if hit.size else None
    where = int(hit[0]) if hit.size else best
    signals = {k: round(float(v[where]), 3) for k, v in per.items() if v[where] > 0}
    label = None
    if score >= THRESHOLD:
        rep = sum(v for k, v in signals.items() if k in _REPETITION_SIGNALS)
        label = REPETITION if rep >= score / 2 else TOKEN_SALAD
    return TextFinding(label, round(score, 4), offset, signals)


__all__ = ["THRESHOLD", "WINDOW", "TextFinding", "score_text"]
