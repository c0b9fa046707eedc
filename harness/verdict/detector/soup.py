"""Soup at the end of fluent prose: an answer that stops being words and never comes back.

A cache fault that lets a sequence read another sequence's values writes, from some position
on, what the other sequence's keys make of it: sub-word pieces glued without their
boundaries (``aachild'is aof thminationforma``), capitalised word-pieces
(``LaceR AGEMEIT lifesacred GAMETH``) or, when the values are noise, a run of random
printable characters (``hash $IEPSH'd~Pgmq|jb>!&]/p?e(unee=N``). Before it the answer is
fluent, and the soup starts right after one of its words, in the middle of a sentence. In a
long answer the soup is a small share of the text, so the fitted decision (whose features
are shares and worst windows over the whole text) often lets it pass, and the rules see one
odd token or a few capitals inside words, which identifiers have too.

``tail`` reads the end of a text the fitted decision calls clean. Each token is one of:

* a **word**: a word English writes (the lexicon, ``lexicon.zipf``; lower case, capitalised
  or all capitals), a number, a compound of such words (``short-lived``, ``it's``);
* **junk**: letters glued to marks no word holds (``KAY,Anything``, ``}soles``), a digit
  inside letters (``blo3ck``), a capital after lower case where a piece is no word
  (``OunterIWo``, ``EquigoI``; ``findOrCreateRun`` is a name), a lower-case word of 6+
  letters that English never writes, no compound or derived word, written with a 4-gram the
  character model finds improbable (``thminationforma``), capitals that are no word
  (``GAMETH``);
* **odd** (half a junk token): a word or a name English writes seldom (``Tleawh``, ``aof``);
* a **noise run**: one token of ``NOISE_MIN``+ characters without a space, letters of both
  cases, ``NOISE_MARKS``+ kinds of marks, brackets that do not pair up (a regex, JSON,
  markup, a minified line pair theirs), no URL, closing tag or quoted assignment;
* anything else is neutral (names of things: paths, ``a.b``, ``a_b``, code spans; another
  script).

The tail runs from after the last word to the end, with ``MIN_JUNK`` junk tokens
(``MIN_HARD`` of them not odd) and at most ``MAX_WORDS`` words per junk token, or one noise
run. It is soup when what comes before it is English prose (``_english``), the word right
before it does not end with a colon (what follows one is on show: a key, a password, a line
of code), and it is neither inside a code fence nor inside a code span or a quotation opened
on its line, nor on a table's or an indented line, in a text without tool-call markup. The
text's own words shuffled to the end are read apart (``_shuffle_start``).
"""

from __future__ import annotations

import re
from collections import Counter

from harness.verdict.detector import lexicon, stray
from harness.verdict.detector.fitted.charmodel import CharModel, codes
from harness.verdict.detector.fitted.wordmodel import WordModel, words
from harness.verdict.detector.masking import without_markup

#: A noise run: this many characters at least, and this many kinds of marks.
NOISE_MIN = 20
NOISE_MARKS = 5
#: The tail holds at least this many junk tokens (or a noise run) ...
MIN_JUNK = 3
#: ... counting an odd token (a name English does not write, a short rare word) as this
#: much of one, with at least MIN_HARD junk tokens ...
ODD_WEIGHT = 0.5
MIN_HARD = 2
#: ... and at most this many words for each junk token.
MAX_WORDS = 0.34
#: Before the tail: at least this many words among the last PROSE_SPAN tokens, ...
MIN_PROSE = 6
PROSE_SPAN = 16
#: ... at least this share of the words and junk there.
MIN_PROSE_SHARE = 0.8
#: ... at least this many lower-case words of 4+ letters (prose, not a list of names) ...
MIN_LOWER = 2
#: ... and at most this share of its lower-case words of 4+ letters uncommon in English.
MAX_FOREIGN = 0.25
#: A word English writes at least this often (Zipf) is a word.
WORD = 2.5
#: ... and a word of SHORT letters or fewer this often (``tht`` is no word here).
SHORT = 3
SHORT_WORD = 4.0
#: A lower-case word of this many letters that English never writes, with a 4-gram this
#: improbable (bits), is junk.
LONG_UNKNOWN = 6
JUNK_BITS = 12.0
#: Texts longer than this are not read (the tail of a long answer is left to the others) ...
MAX_CHARS = 20000
#: ... and of the others, the last this many characters, and a tail of this many tokens
#: at most (corruptgen's are 1 to 40).
LOOK = 4000
MAX_TAIL = 64
#: Soup ends with junk within its last this many tokens.
BARE = 6
#: The text's own words shuffled and glued (``_shuffle_start``): a run of this many tokens
#: at least, this share of them (and this many) glued or stuttered, of this many letters.
SHUFFLE_TOKENS = 12
SHUFFLE_SHARE = 0.2
SHUFFLE_MIN = 4
SHUFFLE_LEN = 5

WORD_T, JUNK, NOISE, OTHER, ODD = 0, 1, 2, 3, 4

_TOKEN = re.compile(r"\S+")
_LEAD = "\"'([{*_\u201c\u2018"
_TRAIL = ".,;:!?\"')]}*_\u201d\u2019"
#: camelCase, PascalCase, with an acronym inside or at the end (``parseHTML``, ``XMLHttp``).
_CAMEL = re.compile(r"[a-z]*(?:[A-Z][a-z]+|[A-Z]{2,}(?=[A-Z][a-z]|$))+|[a-z]+[A-Z]{2,}")
_HUMPS = re.compile(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+|[A-Z]")
_GLUE = re.compile(r"[^\W\d_][^\w\s'\-.\u2019/&+=]{1,3}[^\W\d_]")
_DIGIT_IN = re.compile(r"[^\W\d_]\d+[^\W\d_]")
_DIGIT_LEAD = re.compile(r"\d([a-z]{4,})")
_NUMBER = re.compile(r"[#$€£]?\d[\d.,:%x/\-]*[a-zA-Z%]{0,3}")
_PLACE = re.compile(r"://|@|^/|\w/\w|^[#$-]")
_NAME = re.compile(r"\w\.\w|_\w|\(\)|`")
_RUN = re.compile(r"[a-z]{8,}")
_MARKS = re.compile(r"[^\w\s]")
#: A piece of 3 letters written twice in a row inside a word (``helpslps``).
_STUTTER = re.compile(r"([a-z]{3})\1")
_PAIRS = {")": "(", "]": "[", "}": "{", ">": "<"}
#: What a run of marks written on purpose holds: a URL, a closing tag, a value assigned
#: in quotes (``class="note"``, ``PASSWORD='...'``).
_WRITTEN = re.compile(r"://|</|=[\"']")
_NON_LATIN = "\u0370"


def noise_run(tok: str) -> bool:
    """A run of random printable characters: ``NOISE_MIN`` or more, no space, upper and
    lower-case letters, ``NOISE_MARKS`` kinds of marks or more, brackets that do not pair up
    (a regex, JSON or a minified line pairs them), no URL, not quoted whole."""
    if len(tok) < NOISE_MIN or not tok.isascii() or _WRITTEN.search(tok):
        return False
    if tok[0] == tok[-1] and tok[0] in "`\"'":
        return False
    if not (any(c.islower() for c in tok) and any(c.isupper() for c in tok)):
        return False
    if len(set(_MARKS.findall(tok))) < NOISE_MARKS:
        return False
    return not _balanced(tok)


def _balanced(tok: str) -> bool:
    stack: list[str] = []
    seen = False
    for c in tok:
        if c in "([{<":
            stack.append(c)
            seen = True
        elif c in ")]}>":
            seen = True
            if not stack or stack.pop() != _PAIRS[c]:
                return False
    return seen and not stack


def _word(w: str) -> bool:
    return lexicon.zipf(w) >= (WORD if len(w) > SHORT else SHORT_WORD)


def _never(w: str) -> bool:
    """A short lower-case word English never writes (``aof``, ``owm``)."""
    return len(w) >= SHORT and w.isascii() and lexicon.zipf(w) == 0.0 and not stray._derived(w)


def _unknown(w: str, cm: CharModel) -> bool:
    """A lower-case word English never writes, no compound or derived word, with an
    improbable 4-gram: glued sub-word pieces."""
    if not w.isascii() or lexicon.zipf(w) > 0.0 or stray._compound(w) or stray._derived(w):
        return False
    return stray._junction([w], cm) >= JUNK_BITS


def kind(tok: str, cm: CharModel) -> int:
    """What one token of prose is: ``WORD_T``, ``JUNK``, ``NOISE``, ``ODD`` or ``OTHER``
    (remembered: tokens repeat from text to text; one character model a process)."""
    if len(tok) > _MEMO_CHARS:
        return _kind(tok, cm)
    k = _KINDS.get(tok)
    if k is None:
        if len(_KINDS) > _KNOWN_MAX:
            _KINDS.clear()
        k = _KINDS[tok] = _kind(tok, cm)
    return k


_KINDS: dict[str, int] = {}
_MEMO_CHARS = 64  # (longer tokens are read each time: a minified line is not kept)


def _kind(tok: str, cm: CharModel) -> int:
    if noise_run(tok):
        return NOISE
    core = tok.lstrip(_LEAD).rstrip(_TRAIL)
    if core.isalpha() and max(core) < _NON_LATIN:
        return _letters(core, cm)  # (most tokens: none of the marks below)
    if not core or not any(c.isalpha() for c in core):
        return WORD_T if core and _NUMBER.fullmatch(core) else OTHER
    if max(core) >= _NON_LATIN or _PLACE.search(core):
        return OTHER
    if _GLUE.search(core) or _DIGIT_IN.search(core):
        return JUNK
    lead = _DIGIT_LEAD.match(core)
    if lead and not _word(lead.group(1)):
        return JUNK
    if _NAME.search(core):  # a name of a thing, unless a piece of it is soup
        return JUNK if any(_unknown(r, cm) for r in _RUN.findall(core)) else OTHER
    if _NUMBER.fullmatch(core):
        return WORD_T
    parts = [p for p in re.split(r"[-'\u2019]", core) if p]
    if not parts or not all(p.isalpha() for p in parts):
        return ODD
    if len(parts) > 1:
        if all(_word(p) or len(p) <= 2 for p in parts):
            return WORD_T
        return JUNK if any(p.islower() and _never(p) for p in parts) else ODD
    return _letters(parts[0], cm)


def _letters(w: str, cm: CharModel) -> int:
    """What a token of Latin letters only is."""
    low, up, title = w.islower(), w.isupper(), w[:1].isupper() and w[1:].islower()
    if low or title or up:
        if _word(w):
            return WORD_T
        if up:
            if len(w) >= 6 and lexicon.zipf(w) == 0.0:
                return JUNK
        elif low and len(w) >= LONG_UNKNOWN and _unknown(w, cm):
            return JUNK
        return ODD if lexicon.zipf(w) < stray.RARE else OTHER
    humps = _HUMPS.findall(w)  # mixed case: a name whose pieces are words, or soup
    if humps and w[:1].islower() and len(humps[0]) == 1:
        humps = humps[1:]  # iPhone, eBay
    if _CAMEL.fullmatch(w):  # a name's shape: soup only with a piece no word has
        return JUNK if any(len(h) >= 4 and lexicon.zipf(h) < stray.RARE for h in humps) else OTHER
    if all(len(h) <= 2 or lexicon.zipf(h) >= WORD for h in humps):
        return ODD
    return JUNK


def _soup_start(toks: list[re.Match[str]], cm: CharModel, wm: WordModel) -> int:
    """The first token of the longest run of junk to the end (``tail``), or -1."""
    if _ends_in_words([t.group(0) for t in toks[-2:]], wm):
        return -1
    kinds: list[int] = []
    junk = words = 0.0
    hard = 0
    start = -1
    noise = False
    for i in range(len(toks) - 1, max(0, len(toks) - 1 - MAX_TAIL), -1):
        k = kind(toks[i].group(0), cm)
        kinds.append(k)
        if k == WORD_T:
            words += 1
            if words > MAX_WORDS * max(junk, 1) + 2:
                break
        elif k in (JUNK, NOISE, ODD):
            junk += ODD_WEIGHT if k == ODD else 1
            hard += k != ODD
            noise = noise or k == NOISE
            if words <= MAX_WORDS * junk and (junk >= MIN_JUNK and hard >= MIN_HARD or noise):
                start = i
        if len(kinds) == 2 and kinds == [WORD_T, WORD_T]:
            return -1  # the text ends in words
        if not junk and len(kinds) >= BARE:
            return -1  # nor does soup end in so many tokens none of which is junk
    return start


def _shuffle_start(toks: list[re.Match[str]], wm: WordModel) -> int:
    """The first token of a run to the end of ``SHUFFLE_TOKENS`` or more in which
    ``SHUFFLE_SHARE`` of the tokens (and ``SHUFFLE_MIN``) are two words of the text glued
    together (``isyou``, ``forletter``) or a word with a piece of it written twice
    (``helpslps``), neither of them a word English writes: the text's own words shuffled
    and glued. Read only when one of the last ``BARE`` tokens is a word of 5+ letters the
    word model does not know; -1 when there is no such run."""
    last = [_bare(t.group(0)) for t in toks[-BARE:]]
    odd = [c for c in last if len(c) >= SHUFFLE_LEN and c.isascii() and c.isalpha()]
    if not odd or all(_known(odd, wm)):
        return -1
    own = Counter(_bare(t.group(0)).lower() for t in toks)
    glued, start = 0, -1
    for i in range(len(toks) - 1, max(0, len(toks) - 1 - MAX_TAIL), -1):
        glued += _shuffled(_bare(toks[i].group(0)), own)
        n = len(toks) - i
        if n >= SHUFFLE_TOKENS and glued >= SHUFFLE_MIN and glued >= SHUFFLE_SHARE * n:
            start = i
    return start


def _tool_markup(text: str) -> bool:
    """Whether ``text`` holds tool-call markup of any dialect (``masking.without_markup``'s
    spans besides inline code): the parsers judge it, and its names and arguments glued to
    the prose are no soup."""
    _, spans = without_markup(text)
    return any(text[s] != "`" for s, _e in spans)


def _bare(tok: str) -> str:
    return tok.strip(_LEAD + _TRAIL)


def _shuffled(core: str, own: Counter[str]) -> bool:
    """Two words of the text glued, or a word with a piece written twice (``_STUTTER``):
    letters only, 5 or more, a word English writes seldom."""
    if len(core) < SHUFFLE_LEN or not (core.isascii() and core.isalpha()):
        return False
    if lexicon.zipf(core) >= stray.RARE:
        return False
    w = core.lower()
    if _STUTTER.search(w):
        return True
    return any(
        own[w[:j]] and own[w[j:]] and _word(w[:j]) and _word(w[j:]) for j in range(1, len(w))
    )


def tail(text: str, cm: CharModel, wm: WordModel) -> int | None:
    """Where soup starts that runs to the end of fluent English prose, or None. (``wm``
    answers first whether the text ends in two words: then the lexicon is not asked.)"""
    if len(text) > MAX_CHARS or not text.strip():
        return None
    # soup holds no fence: only what follows the last one can be a tail, and only the last
    # LOOK characters are read (their first token may be cut: left out)
    first = max(text.rfind("```"), text.rfind("~~~"), len(text) - LOOK)
    toks = list(_TOKEN.finditer(text, max(first, 0)))[1 if first > 0 else 0 :]
    if len(toks) < MIN_PROSE + 1:
        return None
    start = _soup_start(toks, cm, wm)
    if start < 1:
        start = _shuffle_start(toks, wm)
    if start < 1:
        return None
    while start > 0 and kind(toks[start - 1].group(0), cm) != WORD_T:
        start -= 1  # the tail starts after the last word
        if start < 1 or text[toks[start].end() : toks[start + 1].start()].count("\n"):
            return None
    if toks[start - 1].group(0).endswith((":", "=")):
        return None  # what follows a colon is shown: a key, a password, a line of code
    if not _english([t.group(0) for t in toks[max(0, start - PROSE_SPAN) : start]], cm):
        return None
    at = toks[start].start()
    if not _prose_at(text, at) or _tool_markup(text):
        return None
    return at


def _ends_in_words(last: list[str], wm: WordModel) -> bool:
    """Whether both tokens are words of letters, lower case or capitalised, that the fitted
    word model knows (clean text uses them)."""
    cores = [t.lstrip(_LEAD).rstrip(_TRAIL) for t in last]
    if not all(c.isalpha() and c[1:].islower() for c in cores):
        return False
    return all(_known(cores, wm))


def _known(cores: list[str], wm: WordModel) -> list[bool]:
    """Whether the word model knows each of ``cores`` (one word each)."""
    unsure = [c for c in cores if c not in _KNOWN]
    if unsure:
        if len(_KNOWN) > _KNOWN_MAX:
            _KNOWN.clear()
        h, _ = words(codes(" ".join(unsure)))
        known = [False] * len(unsure) if h.size != len(unsure) else ~wm.unseen(h)[0].astype(bool)
        _KNOWN.update(zip(unsure, (bool(k) for k in known), strict=True))
    return [_KNOWN[c] for c in cores]


#: Whether the word model knows a word (the last words of texts repeat: ``done.``, ``file.``);
#: one word model a process. Emptied past _KNOWN_MAX words.
_KNOWN: dict[str, bool] = {}
_KNOWN_MAX = 50_000


def _english(before: list[str], cm: CharModel) -> bool:
    """Whether the tokens before a tail are English prose: ``MIN_PROSE`` words or more,
    ``MIN_PROSE_SHARE`` of the words and junk, and of the lower-case words of 4+ letters at
    most ``MAX_FOREIGN`` that English writes seldom (another language's words)."""
    kinds = [kind(t, cm) for t in before]
    nw = kinds.count(WORD_T)
    nj = kinds.count(JUNK) + kinds.count(NOISE)
    if nw < MIN_PROSE or nw < MIN_PROSE_SHARE * (nw + nj):
        return False
    low = [w for w in (t.strip(_LEAD + _TRAIL) for t in before) if len(w) >= 4 and w.isalpha()]
    low = [w for w in low if w.islower()]
    rare = sum(lexicon.zipf(w) < WORD for w in low)
    return len(low) >= MIN_LOWER and rare <= MAX_FOREIGN * len(low)


def _prose_at(text: str, at: int) -> bool:
    """Whether ``at`` is in prose: outside code fences, code spans and quotations opened
    before it on its line, not on a table's line, a quoted one or an indented one."""
    head = text[:at]
    if head.count("```") % 2 or head.count("~~~") % 2:
        return False
    line = head[head.rfind("\n") + 1 :]
    if line.count("`") % 2 or line.count('"') % 2 or line.lstrip().startswith(">"):
        return False
    return "|" not in line and not line.startswith(("    ", "\t"))


__all__ = ["NOISE_MIN", "kind", "noise_run", "tail"]
