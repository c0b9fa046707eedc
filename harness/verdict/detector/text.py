"""Token salad and repetition in one model output: a windowed score and where it starts.

Every signal produces events ``(offset, weight)``; a window whose weights reach THRESHOLD is
corrupted.
The score is the largest sum of event weights inside any window of ``WINDOW`` characters
(each signal capped per window, so one weak signal cannot reach the threshold by itself),
so a long clean prefix does not dilute a corrupted tail, and the offset is the first strong
event (weight >= ONSET_WEIGHT) of the first window that reaches the threshold. The signals
and their weights are described in docs/detector.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from harness.verdict.detector import repeat, salad, scripts, soup, stray
from harness.verdict.detector.chars import Chars
from harness.verdict.detector.fitted import features, model
from harness.verdict.detector.masking import Masked, mask, shared_markup

THRESHOLD = 0.7
#: The rules fired strongly: their score reached the cap of its feature (``features.vector``
#: reads ``min(score, RULE_CAP)``), past which the trees see no more evidence; the fitted
#: decision has a third threshold there.
STRONG = features.RULE_CAP
WINDOW = 320  # characters
ONSET_WEIGHT = 0.5  # an event at least this heavy marks the onset
CODE_WEIGHT = 0.6  # salad events inside fenced or indented code
GLUED_WEIGHT = 0.3  # one token made of two other words of the text

TOKEN_SALAD = "token_salad"
REPETITION = "repetition"

#: Per-window caps of the weak signals.
_CAPS = {
    "identifier_soup": 0.6,
    "stutter": 0.6,
    "glued_punctuation": 0.8,
    "stray_symbol": 1.2,
    "script_variety": 0.45,
    "glued_words": 0.9,
    "glued_sentence": 0.6,
}
REPETITION_SIGNALS = frozenset({"loop", "drift", "char_run", "special_token_run", "stutter_run"})
#: Signals that describe prose; code legitimately has "?;", "parseHTML", "aa aa".
_PROSE_ONLY = frozenset(
    {
        "glued_punctuation",
        "stray_symbol",
        "identifier_soup",
        "stutter",
        "glued_words",
        "glued_sentence",
    }
)
_GAP = re.compile(r"\s*")
_S4_W32 = features.NAMES.index("s4_w32")


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
    """Salad, repetition or clean: what a run and ``harness classify`` use, the decision
    fitted to the corpus (``score_fitted``); ``rules`` is the hand-written one it reads.
    docs/detector.md compares the two on held-out sources."""
    return score_fitted(text, context)


def score_fitted(text: str, context: str | None = None) -> TextFinding:
    """Salad, repetition or clean: the fitted decision over the rule signals, the character
    model and the shape features (``features.py``, ``model.py``); ``score`` is P(corrupted)
    mapped so that the fitted threshold that applied sits at ``THRESHOLD``."""
    if not text or text.isspace():
        return CLEAN
    work = _unescape(text)
    with shared_markup():  # the rules' mask and the features read the same text
        found = rules(work, context, unescaped=True)
        fitted = model.load()
        x, worst = features.vector(
            work, found.score, found.signals, fitted.chars, fitted.words, fitted.weights, context
        )
    bad = fitted.p_corrupted(x)
    if found.score >= STRONG:
        t = fitted.threshold_strong
    elif found.score >= THRESHOLD:
        t = fitted.threshold_rules
    else:
        t = fitted.threshold
    score = THRESHOLD * bad / t if bad < t else THRESHOLD + (1 - THRESHOLD) * (bad - t) / (1 - t)
    signals = dict(found.signals)
    signals["char_surprisal"] = round(float(x[_S4_W32]), 3)
    signals["p_corrupted"] = round(bad, 4)
    if bad < t:
        return (
            _stray_tokens(work, fitted, signals)
            or _soup_tail(work, fitted, signals)
            or TextFinding(None, round(score, 4), None, signals)
        )
    if found.label is not None:  # the rules' own reading of what they found
        label = found.label
    else:
        label = REPETITION if fitted.p_repetition(x) > 0.5 else TOKEN_SALAD
    offset = found.offset if found.offset is not None else worst
    return TextFinding(label, round(score, 4), offset, signals)


def _stray_tokens(
    work: str, fitted: model.DetectorModel, signals: dict[str, float]
) -> TextFinding | None:
    """A text the fitted decision calls clean, with words cut open by stray pieces of
    another sequence (``stray.events``): salad, at the threshold."""
    where = stray.events(work, fitted.words, fitted.chars)
    if not where:
        return None
    return TextFinding(
        TOKEN_SALAD, THRESHOLD, where[0], {**signals, "stray_tokens": float(len(where))}
    )


def _soup_tail(
    work: str, fitted: model.DetectorModel, signals: dict[str, float]
) -> TextFinding | None:
    """A text the fitted decision calls clean that turns into soup after a word of fluent
    prose and never comes back (``soup.tail``): salad, at the threshold."""
    at = soup.tail(work, fitted.chars, fitted.words)
    if at is None:
        return None
    return TextFinding(TOKEN_SALAD, THRESHOLD, at, {**signals, "soup_tail": 1.0})


def rules(text: str, context: str | None = None, *, unescaped: bool = False) -> TextFinding:
    """The hand-written signals alone (windowed weights, THRESHOLD): the decision before the
    fitted one, now its features."""
    if not text or text.isspace():
        return CLEAN
    work = text if unescaped else _unescape(text)
    if len(work) <= _QUICK_MAX and quick_clean(work):
        return CLEAN
    return _score(work, context)


def _score(work: str, context: str | None) -> TextFinding:
    """The full detector: mask, every signal, windows."""
    m = mask(work)  # every step is gated by a substring test: plain prose costs little
    lch = Chars(m.loops)
    pch = lch if m.prose is m.loops else Chars(m.prose)
    ev = _events(pch, repeat.tokenize(m.loops, lch), context, m, _special(work))
    for vs, ve in m.values:
        if len(set(work[vs:ve].strip())) <= 1:
            continue  # one character repeated: padding, a rule line, a fill (an argument)
        sub = rules(work[vs:ve], context)
        if sub.label is not None and sub.offset is not None:
            sig = "loop" if sub.label == REPETITION else "tool_value"
            ev.append((vs + sub.offset, sub.score, sig))
    return _combine(ev) if ev else CLEAN


# ------------------------------------------------------------------ first pass
#: Up to this length the first pass is a few C-speed string scans; past it the vectorized
#: full path costs less than the regex scans would.
_QUICK_MAX = 6000
#: Non-ASCII characters that change nothing for any signal (typographic punctuation);
#: any other one sends the text to the full path (scripts, spaceless tokens, U+FFFD, ...).
_NOT_PLAIN = re.compile("[^\x00-\x7f\u00a0\u00b7\u2010-\u2015\u2018-\u201f\u2022\u2026]")
_RUN4 = re.compile(r"([^\s\d\-=_*#~.+|/\\<>`'\"])\1{3}")
_LOWER_UPPER = re.compile(r"[a-z][A-Z]")
# Python's regex engine skips fast to a pattern's first character when that is a literal or
# a class, and tries a pattern led by a lookbehind or an alternation at every position: the
# patterns below lead with the mark, and the rest is checked on the few matches.
#: ``[^\W\d_]["`|^$%@)\]}][^\W\d_]``, the letter before checked apart
_GLUED_WEAK = re.compile(r"[\"`|^$%@)\]}](?=[^\W\d_])")
#: candidates of ``salad.CLASH``: two clause marks in a row, except ``?!`` pairs
_CLASH = re.compile(r"[?!;:,](?=[?!;:,])")
#: in every match of ``salad.SPACED`` (8+ copies of a mark with 1-3 spaces between), the
#: second and third copies stand between spaces
_SPACED = re.compile(r"\s(\S)\s{1,3}\1\s")
_TOKEN_SEP = bytes(
    c if (48 <= c <= 57 or 97 <= c <= 122) else (c + 32 if 65 <= c <= 90 else 32)
    for c in range(256)
)
_ODD_BYTES = bytes(c for c in range(33, 127) if chr(c) in salad.ODD_SET)
_NOT_ODD = bytes(c for c in range(256) if c not in _ODD_BYTES)


def quick_clean(text: str) -> bool:
    """True when no signal can fire: the text is clean, with a score of 0.

    A handful of C-speed scans (substring tests, short regexes with a literal or a small
    character class first, one ``bytes.translate``, a set of token trigrams). It only
    answers True when the full path would find no event at all; anything that might be
    evidence (a special token, a run, dense punctuation, a glued mark, a capital after a
    lower-case letter, a repeated trigram, a non-ASCII letter) sends the text on.
    """
    # (the cheap tests that most often find something come first: the answer does not
    # depend on the order)
    if _NOT_PLAIN.search(text):
        return False
    if ("<" in text or "[" in text) and next(salad.special_tokens(text), None) is not None:
        return False
    raw = text.encode("ascii", "replace")
    for word in raw.split():
        # symbol soup needs 16+ characters without a space and three kinds of odd marks
        if len(word) >= 16 and len(set(word.translate(None, _NOT_ODD))) >= 3:
            return False
    for m in salad.GLUED.finditer(text):
        if m.start() > 0 and text[m.start() - 1].isalpha():
            return False
    toks = raw.translate(_TOKEN_SEP).split()
    tri = list(zip(toks, toks[1:], toks[2:], strict=False))
    dup3 = len(tri) - len(set(tri))
    if dup3:
        quads = list(zip(toks, toks[1:], toks[2:], toks[3:], strict=False))
        if len(quads) != len(set(quads)) or dup3 >= 0.44 * min(64, len(tri)):
            return False
    if _LOWER_UPPER.search(text) and salad.CASE.search(text):
        return False
    # (the text is plain here: its letters are ASCII letters, so ``isalpha`` is ``[^\W\d_]``)
    for m in _GLUED_WEAK.finditer(text):
        if m.start() > 0 and text[m.start() - 1].isalpha():
            return False
    for m in _CLASH.finditer(text):
        if not (text[m.start()] in "?!" and text[m.start() + 1] in "?!"):
            return False
    if _any_run4(raw) and _RUN4.search(text):
        return False
    if _any_glued(toks) or any(_periodic(t) for t in toks if len(t) >= 8):
        return False
    return _SPACED.search(text) is None or salad.SPACED.search(text) is None


def _any_run4(raw: bytes) -> bool:
    """Four equal bytes in a row (one byte per character: a run of any character)."""
    x = np.frombuffer(raw, np.uint8)
    same = x[1:] == x[:-1]
    return bool((same[:-2] & same[1:-1] & same[2:]).any())


def _periodic(t: bytes) -> bool:
    """``repeat.periodic`` on one token: a unit of 2-8 letters repeated 4+ (6+) times.

    Only the periods ``k`` with ``t[k] == t[0]`` can be one."""
    if not t.isalpha():
        return False
    first = t[:1]
    k = t.find(first, 2, 9)
    while k >= 0:
        if len(t) >= (6 if k == 2 else 4) * k and t[k:] == t[:-k]:
            return True
        k = t.find(first, k + 1, 9)
    return False


def _any_glued(toks: list[bytes]) -> bool:
    """``repeat.glued`` on a short token list: a once-seen word made of two other words."""
    counts: dict[bytes, int] = {}
    for t in toks:
        counts[t] = counts.get(t, 0) + 1
    vocab = {t for t in counts if len(t) >= 3 and t.isalpha()}
    for t, c in counts.items():
        if c == 1 and len(t) >= 6 and t.isalpha():
            for i in range(3, len(t) - 2):
                if t[:i] in vocab and t[i:] in vocab:
                    return True
    return False


def _events(
    ch: Chars,
    tok: repeat.Tokens,
    context: str | None,
    m: Masked | None,
    specials: list[tuple[int, float, str]] | None = None,
) -> list[tuple[int, float, str]]:
    """All events of one text (``m``: the mask, in the second pass)."""
    ev = salad.primary_events(ch, fffd=False)  # U+FFFD is read in the raw text
    if not ch.ascii:
        _scripts(ch, ev)
    code = m.code if m is not None else ()
    if specials is None:
        specials = _special(ch.text)
    ev.extend(
        e
        for e in specials
        if m is None or e[2] == "replacement_char" or not (m.quoted_at(e[0]) or m.markup_at(e[0]))
    )
    ev.extend((p, GLUED_WEIGHT, "glued_words") for p in repeat.glued(tok).tolist())
    for p, copies in repeat.periodic(tok):  # a loop inside one word
        ev.append((p, (copies - 1) * 0.35, "loop"))
    if code and ev:  # salad inside code counts, but code is noisy: less weight
        ev = _code_weight(ev, m)
    _loops(tok, context, code, ev)
    if ev:
        _stutters(ch, tok, m, ev)
    return ev


def _scripts(ch: Chars, ev: list[tuple[int, float, str]]) -> None:
    ids = scripts.script_ids_of(ch)
    pos, w = scripts.switch_events_near(ids, ch.wide)
    ev.extend(zip(pos.tolist(), w.tolist(), ["script_switch"] * pos.size, strict=True))
    if scripts.scripts_present(ids, ch.wide) >= 4:
        pos, w = scripts.variety_events(ids, newlines=(ch.b == 10).nonzero()[0])
        ev.extend(zip(pos.tolist(), w.tolist(), ["script_variety"] * pos.size, strict=True))


def _code_weight(
    ev: list[tuple[int, float, str]], m: Masked | None
) -> list[tuple[int, float, str]]:
    if m is None:
        return ev
    where = m.in_code(np.array([e[0] for e in ev], dtype=np.int64))
    return [
        (p, w * CODE_WEIGHT, s) if c else (p, w, s)
        for (p, w, s), c in zip(ev, where, strict=True)
        if not (c and s in _PROSE_ONLY)
    ]


def _stutters(
    ch: Chars, tok: repeat.Tokens, m: Masked | None, ev: list[tuple[int, float, str]]
) -> None:
    """Stutters are capped below the threshold: read only within a window of other events."""
    spans: list[list[int]] = []
    for p in sorted({e[0] for e in ev}):
        lo, hi = max(0, p - WINDOW - 16), min(len(ch), p + WINDOW + 16)
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = hi
        else:
            spans.append([lo, hi])
    found = salad.stutter_events(ch, [(lo, hi) for lo, hi in spans])
    found.extend(_double_words(ch.text, tok, spans))
    if found and m is not None and m.code:
        found = _code_weight(found, m)
    ev.extend(found)


def _double_words(
    text: str, tok: repeat.Tokens, spans: list[list[int]]
) -> list[tuple[int, float, str]]:
    """The same word twice in a row ("side side"), from equal neighbouring token ids, both
    tokens starting inside one of ``spans`` (sorted, disjoint)."""
    if len(tok) < 2 or not spans:
        return []
    same = tok.ids[1:] == tok.ids[:-1]
    if tok.letters is not None:  # (a word of letters, two or more: checked below, on fewer)
        same &= tok.letters[:-1] & (tok.ends[:-1] - tok.starts[:-1] >= 2)
    same = same.nonzero()[0]
    if not same.size:
        return []
    lo, hi = np.array(spans, dtype=np.int64).T
    first = tok.starts[same]
    k = lo.searchsorted(first, side="right") - 1  # the span the first token starts in
    inside = (k >= 0) & (tok.starts[same + 1] < hi[np.maximum(k, 0)]) & (first < hi[k])
    out = []
    for k in same[inside].tolist():
        s1, e1 = int(tok.starts[k]), int(tok.ends[k])
        s2, e2 = int(tok.starts[k + 1]), int(tok.ends[k + 1])
        w = text[s1:e1]
        if len(w) >= 2 and w.isalpha() and w == text[s2:e2] and text[e1:s2].isspace():
            out.append((s1, 0.25, "stutter"))
    return out


def _special(text: str) -> list[tuple[int, float, str]]:
    """Special-token debris; a run of the same token is a loop, not just debris.

    Searched in the whole text (debris inside a tool-call argument is still debris); the
    caller drops the ones in quoted code spans, where documentation shows template tokens.
    """
    ev = salad.replacement_chars(text)
    found = list(salad.special_tokens(text))
    if not found:
        return ev
    if "<s>" in text and "</s>" in text:  # strike-through markup, not BOS/EOS
        found = [f for f in found if f[2] not in ("<s>", "</s>")]
    run_start, run_tok, run_end, count = -1, "", -1, 0
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
    return ev


def _loops(
    tok: repeat.Tokens,
    context: str | None,
    code: tuple[tuple[int, int], ...],
    ev: list[tuple[int, float, str]],
) -> None:
    ctx = (lambda: repeat.tokenize(context)) if context else None
    loops = repeat.find(tok, ctx)
    for lp in loops[:8]:
        pos = int(tok.starts[min(lp.start, len(tok) - 1)])
        score = lp.score
        if any(s <= pos < e for s, e in code):
            score *= 0.5
        ev.append((pos, score, lp.kind))


def _onset(ev: list[tuple[int, float, str]], start: int) -> int:
    """Where the corruption starts in the first window that reached the threshold: its first
    event strong enough to count on its own (weak context events such as a script-variety
    note on the line may come earlier), else the window's start. ``ev`` is sorted."""
    for pos, weight, _sig in ev:
        if pos >= start + WINDOW:
            break
        if pos >= start and weight >= ONSET_WEIGHT:
            return pos
    return start


def _combine(ev: list[tuple[int, float, str]]) -> TextFinding:
    ev.sort()
    pos_list, weights, names = zip(*ev, strict=True)
    pos = np.array(pos_list, dtype=np.int64)
    w = np.array(weights, dtype=np.float64)
    starts = pos[np.concatenate(([True], pos[1:] != pos[:-1]))]  # pos is sorted
    ends = starts + WINDOW
    sigs = sorted(set(names))  # a fixed order: the float sums, hence the score, are the same
    # in every process (set order follows the hash seed)
    code_of = {sig: i for i, sig in enumerate(sigs)}
    code = np.array([code_of[n] for n in names], dtype=np.intp)
    per: dict[str, np.ndarray] = {}
    for sig in sigs:
        sel = code == code_of[sig]
        p = pos[sel]
        c = np.concatenate(([0.0], w[sel].cumsum()))
        sums = c[p.searchsorted(ends, side="left")] - c[p.searchsorted(starts, "left")]
        per[sig] = np.minimum(sums, _CAPS.get(sig, np.inf))
    total = np.sum(list(per.values()), axis=0)
    best = int(np.argmax(total))
    score = float(total[best])
    hit = (total >= THRESHOLD).nonzero()[0]
    offset = _onset(ev, int(starts[hit[0]])) if hit.size else None
    where = int(hit[0]) if hit.size else best
    signals = {k: round(float(v[where]), 3) for k, v in per.items() if v[where] > 0}
    label = None
    if score >= THRESHOLD:
        rep = sum(v for k, v in signals.items() if k in REPETITION_SIGNALS)
        label = REPETITION if rep >= score / 2 else TOKEN_SALAD
    return TextFinding(label, round(score, 4), offset, signals)


__all__ = ["THRESHOLD", "WINDOW", "TextFinding", "rules", "score_fitted", "score_text"]
