"""Salad events: each is (position, weight, signal). Positions are character offsets.

Weights are on the scale of ``text.THRESHOLD`` (0.7): one event of weight 1.0 is enough on
its own; weaker events must meet others in the same window.

Speed: every text is seen through one ``Chars`` view, built once: the ASCII bytes of the
text with every non-ASCII character replaced by 0x7F. Character classes are then
``bytes.translate`` lookups (C speed, one byte per character) read as numpy boolean arrays;
candidate positions come from a few vectorized comparisons, and only the few candidates
are checked in Python. No regex is tried at every position of a long text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from harness.verdict.detector.chars import RULE_CHARS, SOUP_NORMAL, BoolArray, Chars

__all__ = ["SPECIAL", "Chars", "events", "primary_events", "special_tokens", "stutter_events"]

Event = tuple[int, float, str]

#: Special tokens of chat templates and tokenizers that never belong in visible content,
#: written without their leading "<" (every one of them starts with it) ...
_SPECIAL_LT = (
    r"\|(?:im_start|im_end|im_sep|endoftext|end_of_text|begin_of_text|eot_id|eom_id"
    r"|start_header_id|end_header_id|fim_prefix|fim_middle|fim_suffix|endofprompt|pad"
    r"|assistant|user|system|end|start|return|call|channel|message|constrain)\|>"
    r"|\uff5c(?!DSML\uff5c)[^\uff5c<>\n]{1,40}\uff5c>"  # DeepSeek fullwidth-bar tokens
    r"|/?think>|/?s>|unk>|pad>|mask>|bos>|eos>|start_of_turn>|end_of_turn>"
    r"|<SYS>>|</SYS>>|extra_id_\d+>|\|reserved_special_token_\d+\|>|0x[0-9A-F]{2}>"
)
#: ... and the bracketed ones.
_SPECIAL_SQ = r"\[(?:PAD|UNK|CLS|SEP|MASK)\]|\[/?INST\]"
SPECIAL = re.compile(f"<(?:{_SPECIAL_LT})|{_SPECIAL_SQ}")
# One pattern per leading character: each starts with a literal, which the regex engine
# finds at memchr speed instead of trying the whole alternation at every position.
_SPECIAL_SCANS = (re.compile(f"<(?:{_SPECIAL_LT})"), re.compile(_SPECIAL_SQ))
#: End-of-turn tokens: one at the very end of a raw output is where it belongs.
_EOS_END = re.compile(
    "(?:<\uff5cend\u2581of\u2581sentence\uff5c>|<\\|im_end\\|>|<\\|eot_id\\|>|<\\|endoftext\\|>"
    "|<\\|end\\|>|<\\|return\\|>|<end_of_turn>|</s>)\\s*\\Z"
)
_FFFD = re.compile("\ufffd+")
#: One character repeated: punctuation and symbols (not the ones markdown and ASCII art
#: draw lines with), letters of any script, or spaceless-script characters.
_ASCII_SOUP = re.compile(r"(?:[A-Za-z0-9]{0,6}[!-/:-@\[-`{-~]){6,}[A-Za-z0-9]{0,6}")
_REGEX_LIKE = re.compile(r"\\[dwsDWSbB.]|\[\^?[^\]]{1,40}\]|\(\?[:=!<]|\{\d+(?:,\d*)?\}")
ODD_SET = {chr(c) for c in range(33, 127) if not chr(c).isalnum()} - SOUP_NORMAL
#: Sentence punctuation glued between two letters ("doubts?只", "i#else").
GLUED = re.compile(r"[?!;#~](?=[^\W\d_])")
#: An ASCII symbol inside a run of spaceless-script letters ("的$的").
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\u0e00-\u0e7f"
_SANDWICH = re.compile(f"(?<=[{_CJK}])[?!;#~$@^\\\\|&*=+%](?=[{_CJK}])")
_CLAUSE = set("?!;:,.")
#: Two different clause marks touching ("?;", ",:"): no writing system puts them together.
CLASH = re.compile(r"[?!][;:,]|[;:,][?!;:,]")
#: Lower-case letters followed by upper-case ones to the end of the word ("bolE",
#: "ManagerULATE"): tokenizer pieces glued, outside code.
CASE = re.compile(r"(?<![A-Za-z])[A-Za-z]?[a-z]{2,}[A-Z]+(?![A-Za-z])|[a-z][A-Z]{3,}")
#: Three or more spaceless-script characters each doubled in a row ("的的是是在在").
_DOUBLED = re.compile(f"(?:([{_CJK}])\\1){{3,}}")


def special_tokens(text: str) -> Iterator[tuple[int, int, str]]:
    """Special tokens in ``text``; one end-of-turn token at the very end is normal."""
    if "<" not in text and "[" not in text:
        return
    eos = _EOS_END.search(text) if text.rstrip().endswith(">") else None
    found: list[tuple[int, int, str]] = []
    for pat, lead in zip(_SPECIAL_SCANS, "<[", strict=True):
        if lead in text:
            found.extend((m.start(), m.end(), m.group(0)) for m in pat.finditer(text))
    found.sort()
    for s, e, tok in found:
        if eos is None or s != eos.start():
            yield s, e, tok


def events(text: str, ascii_only: bool | None = None) -> Iterator[Event]:
    """All salad events of ``text`` (already masked: code, URLs and markup are blanks)."""
    ch = Chars(text)
    yield from primary_events(ch)
    yield from stutter_events(ch)


def replacement_chars(text: str) -> list[Event]:
    """U+FFFD runs: broken bytes, evidence wherever they are (code and quotes too)."""
    if "\ufffd" not in text:
        return []
    return [
        (m.start(), min(1.5, 0.6 * (m.end() - m.start())), "replacement_char")
        for m in _FFFD.finditer(text)
    ]


def primary_events(ch: Chars, fffd: bool = True) -> list[Event]:
    """Every salad event except stutters (those only count next to other evidence)."""
    out: list[Event] = []
    text = ch.text
    if len(text) < 2:
        return out
    if fffd and not ch.ascii:
        out.extend(replacement_chars(text))
    _char_runs(ch, out)
    _spaced_runs(ch, out)
    _symbol_soup(ch, out)
    _glued(ch, out)
    _glued_stop(ch, out)
    _clash(ch, out)
    _case(ch, out)
    if not ch.ascii:
        _sandwich(ch, out)
        if len(text) >= 6:
            c = ch.codes
            eq = (c[1:] == c[:-1]) & (c[1:] >= 0x0E00)  # doubled spaceless characters
            last = -1
            for i in (eq[:-4] & eq[2:-2] & eq[4:]).nonzero()[0].tolist():
                dm = _DOUBLED.match(text, i) if i >= last else None
                if dm is not None:
                    last = dm.end()
                    out.append((dm.start(), (dm.end() - dm.start()) / 4 - 0.5, "stutter_run"))
    return out


SPACED = re.compile(r"(\S)(?:\s{1,3}\1){7,}")


def _spaced_runs(ch: Chars, out: list[Event]) -> None:
    """One mark repeated 8+ times with only whitespace between ("|\n|\n|", "😂 😂 😂"): a
    loop of a token that is not a word. Rule characters on one line draw rules."""
    c = ch.b if ch.ascii else ch.codes
    if c.size < 16:
        return
    sp, alnum = ch.cls("space"), ch.cls("alnum")
    mark = ~sp & ~alnum
    one = (c[2:] == c[:-2]) & sp[1:-1] & mark[:-2]
    if np.count_nonzero(one) < 4:
        return
    text, last = ch.text, -1
    for i in one.nonzero()[0].tolist():
        if i < last:
            continue
        m = SPACED.match(text, i)
        if m is None:
            continue
        last = m.end()
        if m.group(1) in RULE_CHARS and "\n" not in m.group(0):
            continue
        n = len(m.group(0).split())
        out.append((i, min(3.0, (n - 6) / 4), "char_run"))


def _char_runs(ch: Chars, out: list[Event]) -> None:
    """Four or more of the same character (not spaces, digits or rule characters)."""
    text = ch.text
    if len(text) < 4:
        return
    c = ch.b if ch.ascii else ch.codes
    eq = c[1:] == c[:-1]
    four = eq[:-2] & eq[1:-1] & eq[2:] & ch.cls("run_ok")[:-3]
    if not np.count_nonzero(four):
        return
    idx = four.nonzero()[0]
    breaks = (np.diff(idx) != 1).nonzero()[0]
    firsts = idx[np.concatenate(([0], breaks + 1))].tolist()
    lasts = idx[np.concatenate((breaks, [idx.size - 1]))].tolist()
    for s, last in zip(firsts, lasts, strict=True):
        c0, n = text[s], last - s + 4
        if c0.isspace() or c0.isdigit() or c0 in RULE_CHARS:
            continue
        # letters ("AAAAAAA", "加加加加") need longer runs than punctuation ("!!!!")
        w = ((n - 3) / 5 if c0.isascii() else (n - 2) / 6) if c0.isalnum() else (n - 2) / 4
        if w > 0:
            out.append((s, min(w, 3.0), "char_run"))


def _symbol_soup(ch: Chars, out: list[Event]) -> None:
    """Space-free runs dense in ASCII punctuation: only runs of 16+ characters with 6+ marks,
    3 of them outside the JSON set, are read by the soup pattern."""
    odd = ch.cls("odd").nonzero()[0]
    if odd.size < 3:
        return
    seps = ch.cls("soup_sep").nonzero()[0]
    seg = seps.searchsorted(odd)  # which space-free run each odd mark is in
    hit = (seg[2:] == seg[:-2]).nonzero()[0]
    if not hit.size:
        return
    k = seg[hit]
    k = k[np.concatenate(([True], k[1:] != k[:-1]))]  # distinct runs (seg is sorted)
    n = len(ch)
    lo = np.where(k > 0, seps[np.maximum(k - 1, 0)] + 1, 0) if seps.size else np.zeros_like(k)
    hi = seps[np.minimum(k, seps.size - 1)] if seps.size else np.full_like(k, n)
    if seps.size:
        hi = np.where(k < seps.size, hi, n)
    keep = (hi - lo) >= 16
    if not np.count_nonzero(keep):
        return
    lo, hi = lo[keep], hi[keep]
    punct = ch.cls("punct").nonzero()[0]
    many = (punct.searchsorted(hi) - punct.searchsorted(lo)) >= 6
    text = ch.text
    for a, b in zip(lo[many].tolist(), hi[many].tolist(), strict=True):
        if len(set(text[a:b]) & ODD_SET) >= 3:  # three kinds of odd marks, or no soup
            out.extend(_soup(text, a, b))


def _soup(text: str, lo: int, hi: int) -> Iterator[Event]:
    for m in _ASCII_SOUP.finditer(text, lo, hi):
        s = m.group(0)
        punct = {c for c in s if not c.isalnum()}
        odd = punct - SOUP_NORMAL
        if len(s) >= 16 and len(punct) >= 5 and len(odd) >= 3 and len(_REGEX_LIKE.findall(s)) < 2:
            yield m.start(), min(1.5, len(s) / 20 * len(odd) / 5), "symbol_soup"


def _neighbours(ch: Chars, table: str, around: str) -> npt.NDArray[np.int64]:
    """Positions of ``table`` characters with an ``around`` character on both sides."""
    mark = ch.cls(table)
    if len(ch) < 3 or not np.count_nonzero(mark[1:-1]):
        return np.zeros(0, dtype=np.int64)
    nb = ch.cls(around)
    return (mark[1:-1] & nb[:-2] & nb[2:]).nonzero()[0] + 1


def _glued(ch: Chars, out: list[Event]) -> None:
    """Sentence marks glued between two letters ("doubts?只") 0.4; quotes, bars, braces and
    the like inside a word ("Jepse`n", "e"t") 0.3: stray pieces of other tokens."""
    text = ch.text
    for i in _neighbours(ch, "glue", "letter_or_wide").tolist():
        if text[i - 1].isalpha() and GLUED.match(text, i):
            out.append((i, 0.4, "glued_punctuation"))
    for i in _neighbours(ch, "glue_weak", "letter_or_wide").tolist():
        if text[i - 1].isalpha() and text[i + 1].isalpha():
            out.append((i, 0.3, "glued_punctuation"))


#: A sentence glued to the next one, "rows.The": word soup glues words with their
#: punctuation. Only a period between two letters (of any cased script) followed by a
#: capitalized word: "config.yaml" and "os.path" are names, CSV has commas.
_GLUED_STOP = re.compile(r"(?<=[^\W\d_]{2})\.(?=[^\W\d_]{2})")


def _glued_stop(ch: Chars, out: list[Event]) -> None:
    text = ch.text
    for i in _neighbours(ch, "dot", "letter_or_wide").tolist():
        if text[i + 1].isupper() and text[i + 2 : i + 3].islower() and _GLUED_STOP.match(text, i):
            out.append((i, 0.3, "glued_sentence"))


def _sandwich(ch: Chars, out: list[Event]) -> None:
    for i in _neighbours(ch, "sandwich", "wide").tolist():
        if _SANDWICH.match(ch.text, i):
            out.append((i, 0.6, "stray_symbol"))


def _clash(ch: Chars, out: list[Event]) -> None:
    """Two different clause marks touching ("?;", ",:"), not inside a longer run of marks."""
    semi = ch.cls("semi")
    if len(ch) < 2 or not np.count_nonzero(semi):
        return
    bang = ch.cls("bang")
    pair = (bang[:-1] & semi[1:]) | (semi[:-1] & (semi[1:] | bang[1:]))
    if not np.count_nonzero(pair):
        return
    clause = ch.cls("clause")
    ok = pair.copy()
    ok[1:] &= ~clause[:-2]
    ok[:-1] &= ~clause[2:]
    out.extend((i, 0.4, "stray_symbol") for i in ok.nonzero()[0].tolist())


def _case(ch: Chars, out: list[Event]) -> None:
    """Identifier soup: lower case, then capitals to the end of the word (``_CASE``).

    Vectorized: for every lower-to-upper transition, the capitals that follow and the
    lower-case run before it decide; camelCase (``getElementById``) falls out at once.
    """
    low, up = ch.cls("low"), ch.cls("up")
    cand = (low[:-1] & up[1:]).nonzero()[0]
    if not cand.size:
        return
    n = len(ch)
    letter = low | up
    # the capitals after cand end where their run ends (run ends are fewer than the
    # characters that are not capitals)
    up_ends = np.append((up[:-1] & ~up[1:]).nonzero()[0] + 1, n)  # (n: a run to the end)
    nxt = up_ends[up_ends.searchsorted(cand + 1, side="right")]
    caps = nxt - cand - 1
    after_letter = np.zeros(cand.size, dtype=bool)
    inside = nxt < n
    after_letter[inside] = letter[nxt[inside]]
    # branch 1: [A-Za-z]?[a-z]{2,} then the capitals, then no letter
    low_starts = np.concatenate(([0], (low[1:] & ~low[:-1]).nonzero()[0] + 1))
    # last non-lower before cand: just before the start of its lower-case run (a run
    # that starts the text makes it -1; the 0 put first is such a start or precedes one)
    jpos = low_starts[low_starts.searchsorted(cand, side="right") - 1] - 1
    run = cand - jpos  # lower-case letters ending at cand
    lead = np.zeros(cand.size, dtype=bool)  # one letter leads the lower-case run
    ok_j = jpos >= 0
    lead[ok_j] = letter[jpos[ok_j]]
    before = jpos - 1
    clear = np.ones(cand.size, dtype=bool)  # no letter before the match
    ok_b = lead & (before >= 0)
    clear[ok_b] = ~letter[before[ok_b]]
    word_like = ~after_letter & (run >= 2) & clear
    # branch 2: [a-z][A-Z]{3,} anywhere
    start = np.where(word_like, np.where(lead, jpos, jpos + 1), cand)
    hit = word_like | (caps >= 3)
    out.extend((p, 0.2, "identifier_soup") for p in sorted(set(start[hit].tolist())))


def stutter_events(ch: Chars, spans: list[tuple[int, int]] | None = None) -> list[Event]:
    """A 3-8 letter syllable doubled inside a word ("overwardwardwards"), starting inside
    one of ``spans`` (all of the text by default). (The same word twice in a row is found
    from tokens, in text.py.)

    Weak (capped below the threshold), so text.py reads them only near other evidence.
    Vectorized: a doubled syllable of k letters needs three equal letters at distance k;
    only those few spots are checked.
    """
    out: list[Event] = []
    text = ch.text
    c = ch.b if ch.ascii else ch.codes
    letter = ch.cls("letter_or_wide")
    for k in range(3, 9):
        if c.size < 2 * k + 1:
            break
        eq = (c[k:] == c[:-k]) & letter[:-k]
        three = eq[:-2] & eq[1:-1] & eq[2:]
        for s in three.nonzero()[0].tolist():
            e = s + k
            if (
                e + k < len(text)
                and text[s:e] == text[e : e + k]
                and text[e + k].isalpha()
                and text[s : e + k].isalpha()
                and len(set(text[s:e])) > 1
                and (spans is None or any(lo <= s < hi for lo, hi in spans))
            ):
                out.append((s, 0.35, "stutter"))
    return out


def _runs(mask: BoolArray, min_len: int) -> list[tuple[int, int]]:
    """(start, end) of the runs of True in ``mask`` at least ``min_len`` long."""
    if mask.size < min_len or not np.count_nonzero(mask):
        return []
    d = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    st, en = (d == 1).nonzero()[0], (d == -1).nonzero()[0]
    keep = (en - st) >= min_len
    return list(zip(st[keep].tolist(), en[keep].tolist(), strict=True))
