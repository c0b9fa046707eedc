"""Stray tokens: sub-word pieces of another sequence glued inside the words of fluent text.

A cache fault that hands a sequence a few positions of another writes their tokens where the
sequence's own belong: a piece of a word (or a mark, a digit, a piece of another script)
lands inside a word, and the text reads ``Let me checLk if there are any recent
depcontenloyments``. Every other word is right, so the character and word models see a few
unseen words in a text that has many anyway (names, identifiers, paths), and the rules see a
capital or a digit inside a word, which healthy code has too.

What only such a word has: it is *a known word with a piece put in*. Take the piece out
and the word is a word of the text itself, or one clean text uses (the fitted word model's
bit tables, ``fitted.wordmodel``) that fits a neighbour (clean text uses the pair) or is
long. Healthy unseen words (names, identifiers, rare words, words of a language the model
knows little) seldom become one by taking a piece out of their middle.

Seldom is not never: a bit table answers "known" for an unseen word now and then (a hash
collision) and a word can be repaired in dozens of ways. So one repaired word of the same
script is no evidence: it takes ``MIN_WORDS`` within ``SPAN`` characters, in text whose other
words the model knows (``MAX_UNKNOWN``), one of them written with a 4-gram that clean text
almost never writes where the piece joins it (``JUNCTION_BITS``). A piece of another writing
system inside a Latin word (``serv服务ice``) is evidence on its own.

The word model was counted on documentation and knows little ordinary English, so a second
reading (``lexicon_events``) asks an English lexicon (``lexicon.zipf``): a lower-case word
English does not write that becomes a common word when a piece is taken out of its middle
(``peofople``), two close together or one English never writes, in English prose.

``text.score_fitted`` reads this after the fitted decision called a text clean: a text with
such words is salad, at the threshold, with the signal ``stray_tokens`` (the number of words).
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import numpy as np
import numpy.typing as npt

from harness.verdict.detector import lexicon
from harness.verdict.detector.fitted.charmodel import CharModel, codes
from harness.verdict.detector.fitted.wordmodel import WordModel, text_words, words, words_at

#: A stray piece is 1 to this many characters (a token or two).
MAX_PIECE = 8
#: The repaired word has at least this many letters (short words collide in the tables).
MIN_WORD = 5
#: ... and a word of the text itself at least this many.
MIN_OWN = 4
#: A repaired word this long needs no neighbour that fits it (the pair tables are counted
#: on documentation: ``me update`` is not in them).
LONG_WORD = 7
#: Repaired words needed within SPAN characters for an event.
MIN_WORDS = 2
SPAN = 160
#: At most this share of the text's other words of 4+ letters unknown to the word model.
MAX_UNKNOWN = 0.08
#: At least one word cut open writes a 4-gram this improbable (bits) where the piece
#: joins it: real words the word model does not know (a rare word, another language) write
#: none so improbable.
JUNCTION_BITS = 10.0
#: Longer texts are not read (the cost grows with the unknown words; a fault's stray
#: tokens in a long answer are left to the other signals).
MAX_CHARS = 6000

#: The lexicon's reading (``lexicon_cut``): a word the language writes less often than this
#: (Zipf frequency: log10 of its uses a billion words) is rare ...
RARE = 1.5
#: ... one it writes this often is common (a word of ``MIN_OWN`` letters: ``COMMON_SHORT``) ...
COMMON = 3.0
COMMON_SHORT = 4.0
#: ... and a word whose two parts are written this often is a compound.
SPLIT = 2.5
#: Fewer lower-case words of 4+ letters than this: too little prose to tell its language.
MIN_PROSE = 4
#: At most this share of the text's other lower-case words of 4+ letters uncommon in
#: English (a text in another language has many: ``solicitud`` becomes ``solid``).
UNCOMMON = 2.5
MAX_RARE = 0.25
#: One word cut open is enough when English never writes it and its repaired word has this
#: many letters.
LONE_WORD = 7
#: ... or when it writes a 4-gram this improbable (bits of the character model).
LONE_BITS = 12.0

_TOKEN = re.compile(r"\S+")
#: A token's core: from its first letter to its last (quotes, brackets, marks around it off).
_CORE = re.compile(r"[^\W\d_].*[^\W\d_]", re.S)
#: Tokens that are names of things, not words of prose: paths, URLs, identifiers, markup.
_NOT_PROSE = re.compile(r"[/\\_@=<>{}\[\]|`*#$%&~^]|://|\.\w+\.")


#: An identifier's shape: a lower-case letter, then a capital and lower-case letters
#: (``sendMessage``, ``MatrixElement``).
_CAMEL = re.compile(r"[a-z][A-Z][a-z]{2}")
_MARKS = re.compile(r"[^\w]+|\d+")


def _core(
    tok: str, wm: WordModel, capital: bool = False, known: dict[str, bool] | None = None
) -> tuple[int, str] | None:
    """Where a token's core starts and the core, when it can be a word of prose cut open by
    a stray piece; None for short tokens, names of things (paths, identifiers, markup) and
    tokens whose parts between marks are words (``short-lived``, ``condition.rhs``).
    ``capital``: a word with one capital inside (``_capital_inside``) is a word too.
    ``known``: the answers for the parts of cores asked before (core -> parts are words)."""
    m = _prose_core(tok)
    if m is None:
        return None
    core = m.group(0)
    if _CAMEL.search(core) and not (capital and _capital_inside(core)):
        return None
    words_in = known.get(core) if known is not None else None
    if words_in is None:
        words_in = _parts_are_words([core], wm)[core]
        if known is not None:
            known[core] = words_in
    return None if words_in else (m.start(), core)


def _prose_core(tok: str) -> re.Match[str] | None:
    """A token's core, when it is long enough to be a word cut open and not a name of a
    thing (``_core``'s first test, and the cores ``TextReading.known`` asks about)."""
    m = _CORE.search(tok)
    if m is None or len(m.group(0)) < MIN_OWN + 1 or _NOT_PROSE.search(m.group(0)):
        return None
    return m


def _parts_are_words(cores: list[str], wm: WordModel) -> dict[str, bool]:
    """For each core, whether it is made of parts between marks (of 4+ characters) one of
    which clean text uses. The parts of all of them are hashed at once, a space between
    two cores' parts: a word never spans one, and a word's hash does not depend on where
    it stands (``wordmodel.words``)."""
    out: dict[str, bool] = {}
    asked: list[str] = []
    pieces: list[str] = []
    for core in cores:
        if core in out:
            continue
        out[core] = False
        parts = [p for p in _MARKS.split(core) if len(p) >= 4]
        if len(parts) > 1 or (parts and parts[0] != core):
            asked.append(core)
            pieces.append(" ".join(parts))
    if asked:
        h, starts, _n = words_at(codes(" ".join(pieces)))
        ends = np.cumsum([len(p) + 1 for p in pieces])  # past each piece and its space
        owner = ends.searchsorted(starts, side="right")  # the piece each word is in
        for k in np.unique(owner[wm.unseen(h)[0] == 0]).tolist():
            out[asked[k]] = True
    return out


_WORD = re.compile(r"[^\W_]+")


def _last_word(tok: str) -> str:
    found = _WORD.findall(tok)
    return found[-1] if found else ""


def _first_word(tok: str) -> str:
    m = _WORD.search(tok)
    return m.group(0) if m else ""


def _unseen6(strings: list[str], cm: CharModel) -> npt.NDArray[np.int64]:
    """How many 6-grams of each string, a space before and after it, clean text never
    used."""
    joined = " " + " ".join(strings) + " "
    flags = cm.unseen6(cm.sixes(codes(joined)))
    c = np.concatenate(([0], np.cumsum(flags)))
    lens = np.array([len(x) for x in strings], dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(lens + 1)[:-1]))  # the space before each
    last = np.clip(first + lens + 2 - 5, first, flags.size)  # 6-grams up to the space after
    out: npt.NDArray[np.int64] = c[last] - c[first]
    return out


#: From here on, scripts written without spaces (CJK and after): no word to repair.
_SPACELESS = "\u2e80"


#: Letters from here on are not Latin (Greek, Cyrillic, ..., CJK).
_NON_LATIN = "\u0370"


def _fits(word: str) -> bool:
    """A word of prose: letters, lower case after the first."""
    return (
        len(word) >= MIN_OWN
        and word.isalpha()
        and word[1:] == word[1:].lower()
        and max(word) < _SPACELESS
    )


#: ``_unseen_at``'s reading of one text.
Unseen = tuple[npt.NDArray[np.int64], int, int]


class TextReading:
    """What both readings of one text (``model_events``, ``lexicon_cut``) read, each made
    once, when first asked (``events`` hands one to both): the unseen words
    (``_unseen_at``), the text's tokens, which of them hold an unseen word, the text's own
    words counted, and whether the parts of the cores of those tokens are words (``_core``
    asks it of them all at once)."""

    def __init__(self, text: str, wm: WordModel) -> None:
        self.text = text
        self.wm = wm

    @functools.cached_property
    def unseen(self) -> Unseen:
        return _unseen_at(self.text, self.wm)

    @functools.cached_property
    def tokens(self) -> tuple[list[tuple[int, str]], list[int], Counter[str]]:
        """(every token and its offset, the indices of those holding an unseen word, the
        text's words lower-cased and counted)."""
        toks = [(m.start(), m.group(0)) for m in _TOKEN.finditer(self.text)]
        starts = np.array([p for p, _ in toks], dtype=np.int64)
        which = np.unique(starts.searchsorted(self.unseen[0], side="right") - 1).tolist()
        own = Counter(w.lower() for w in _WORD.findall(self.text))
        return toks, which, own

    @functools.cached_property
    def known(self) -> dict[str, bool]:
        """``_parts_are_words`` of the cores ``_core`` can ask about: those of the tokens
        holding an unseen word, but the first and the last, long enough and prose."""
        toks, which, _own = self.tokens
        found = (_prose_core(toks[i][1]) for i in which if 0 < i < len(toks) - 1)
        return _parts_are_words([m.group(0) for m in found if m is not None], self.wm)


def _unseen_at(text: str, wm: WordModel) -> Unseen:
    """Where the words of 5+ characters that clean text does not use start; how many words
    of 4+ characters the text has, and how many of them clean text does not use."""
    h, first, n = text_words(text)
    if not h.size:
        return np.zeros(0, dtype=np.int64), 0, 0
    unseen = wm.unseen(h)[0] == 1
    long = n >= MIN_OWN
    at: npt.NDArray[np.int64] = first[unseen & (n >= MIN_OWN + 1)]
    return at, int(long.sum()), int((unseen & long).sum())


def _share(unknown: int, total: int, cut: int) -> float:
    """The share of unknown words less ``cut`` of them (1 when under 8 words are left)."""
    return 1.0 if total - cut < 8 else max(0, unknown - cut) / (total - cut)


def repaired(
    text: str, wm: WordModel, cm: CharModel, reading: TextReading | None = None
) -> list[tuple[int, str, str, str]]:
    """The words of ``text`` that are a known word with a piece put in: ``(offset of the
    piece, the word as written, the repaired word, the piece)``. The word as written is
    written once, unknown, and holds a 6-gram clean text never wrote. The repaired one is a
    word of the text itself (the piece 2+ characters from either end), or known to the word
    model, writing no unseen 6-gram, of ``MIN_WORD`` letters, and either of ``LONG_WORD``
    or clean text uses a pair it makes with a neighbour. ``reading``: the text's, when
    made."""
    if reading is None:
        reading = TextReading(text, wm)
    if reading.unseen[0].size < 1:
        return []
    toks, which, own = reading.tokens
    cands: list[tuple[int, int, str]] = []  # (token index, core offset, core)
    for i in which:
        if not 0 < i < len(toks) - 1:
            continue
        c = _core(toks[i][1], wm, known=reading.known)
        if c is not None and own[_first_word(c[1]).lower()] == 1:
            cands.append((i, c[0], c[1]))
    if not cands:
        return []
    cores = [c for _, _, c in cands]
    unseen = np.array([_unseen_core(c, wm) for c in cores], dtype=bool)
    unseen &= _unseen6(cores, cm) > 0
    trials: list[tuple[int, int, str, bool]] = []  # (cand, piece start, word, a word of own)
    for k in unseen.nonzero()[0].tolist():
        core = cores[k]
        for size in range(1, MAX_PIECE + 1):
            for s in range(1, len(core) - size):
                if not any(ch.isalnum() for ch in core[s : s + size]):
                    continue  # a hyphen or an apostrophe taken out: compounds, elisions
                word = core[:s] + core[s + size :]
                if not _fits(word):
                    continue
                mine = own[word.lower()] > 0 and s >= 2 and len(core) - s - size >= 2
                if mine or len(word) >= MIN_WORD:
                    trials.append((k, s, word, mine))
    if not trials:
        return []
    # each trial as a triple (the word before, the repaired word, the word after)
    triples = []
    for k, _s, word, _m in trials:
        ti = cands[k][0]
        triples += [_last_word(toks[ti - 1][1]) or "_", word, _first_word(toks[ti + 1][1]) or "_"]
    h, _n = words(codes(" ".join(triples)))
    if h.size != len(triples):
        return []
    w_unseen, p_unseen = wm.unseen(h)
    known = ~w_unseen.reshape(-1, 3)[:, 1].astype(bool)
    fits = ~np.append(p_unseen, 1).reshape(-1, 3)[:, :2].all(axis=1)
    of_text = np.array([t[3] for t in trials], dtype=bool)
    long_word = np.array([len(t[2]) >= LONG_WORD for t in trials], dtype=bool)
    by_model = (known & (fits | long_word) & ~of_text).nonzero()[0]
    ok = known & of_text
    if by_model.size:
        lens = np.array([len(trials[j][2]) for j in by_model.tolist()])
        clean6 = _unseen6([trials[j][2] for j in by_model.tolist()], cm) == 0
        ok[by_model[clean6 & (lens >= MIN_WORD)]] = True
    out: list[tuple[int, str, str, str]] = []
    done: set[int] = set()
    for j in ok.nonzero()[0].tolist():
        k, s, word, _m = trials[j]
        if k not in done:
            done.add(k)
            ti, off, core = cands[k]
            out.append((toks[ti][0] + off + s, core, word, core[s : s + len(core) - len(word)]))
    return out


def _unseen_core(core: str, wm: WordModel) -> bool:
    h, _ = words(codes(core))
    return not (h.size == 1 and not wm.unseen(h)[0][0])


def unknown_share(text: str, wm: WordModel, cut: int = 0) -> float:
    """The share of the words of 4+ letters of ``text`` that clean text does not use, less
    ``cut`` of them (the words cut open); 1 when under 8 words are left."""
    _, total, unknown = _unseen_at(text, wm)
    return _share(unknown, total, cut)


def events(text: str, wm: WordModel, cm: CharModel) -> list[int]:
    """Where stray pieces sit in ``text``: the word model's reading (``model_events``),
    else the lexicon's (``lexicon_events``); none in a text over ``MAX_CHARS``."""
    if len(text) > MAX_CHARS:
        return []
    reading = TextReading(text, wm)
    return model_events(text, wm, cm, reading) or lexicon_events(text, wm, cm, reading)


def lexicon_events(
    text: str, wm: WordModel, cm: CharModel, reading: TextReading | None = None
) -> list[int]:
    """Where the lexicon sees stray pieces (``lexicon_cut``), in text whose other words
    are English (at most ``MAX_RARE`` of them rare): each word cut open that has another
    within ``SPAN`` characters, or one alone that English never writes (not in the lexicon
    at all) repaired into a common word of ``LONE_WORD`` letters, or that writes a 4-gram
    of ``LONE_BITS`` of surprisal. ``reading``: the text's, when made."""
    found, rare = lexicon_cut(text, wm, reading)
    if not found or rare > MAX_RARE:
        return []
    pos = np.array([p for p, *_ in found])
    return [
        p
        for p, core, word, _piece in found
        if int((np.abs(pos - p) <= SPAN).sum()) >= MIN_WORDS
        or (len(word) >= LONE_WORD and lexicon.zipf(core) == 0.0)
        or _junction([core], cm) >= LONE_BITS
    ]


def model_events(
    text: str, wm: WordModel, cm: CharModel, reading: TextReading | None = None
) -> list[int]:
    """Where the word model sees stray pieces: the offset of each word cut open
    (``repaired``) that has at least ``MIN_WORDS - 1`` others within ``SPAN`` characters,
    in text whose other words the word model knows (at most ``MAX_UNKNOWN`` of them
    unknown: in a language or a jargon it knows little, a rare word is repaired into a
    known one by chance). ``reading``: the text's, when made."""
    if reading is None:
        reading = TextReading(text, wm)
    at, total, unknown = reading.unseen
    if not at.size or _share(unknown, total, at.size) > MAX_UNKNOWN:
        return []  # (the share falls with the words cut open, at most one per unknown)
    close = at.size >= MIN_WORDS and bool(
        (at[MIN_WORDS - 1 :] - at[: at.size - MIN_WORDS + 1] <= SPAN).any()
    )
    if not close and text.isascii():
        return []  # no unknown words close enough together, and no other script
    found: list[int] = []
    alone: set[int] = set()
    seen: set[str] = set()
    cores: list[str] = []
    for p, core, word, piece in repaired(text, wm, cm, reading):
        name = _first_word(core).lower()
        if name not in seen:  # a word written twice is one word
            seen.add(name)
            found.append(p)
            cores.append(core)
            if other_script(word, piece):
                alone.add(p)
    if not found or _junction(cores, cm) < JUNCTION_BITS:
        return []
    pos = np.array(found)
    near = [p for p in found if p in alone or int((np.abs(pos - p) <= SPAN).sum()) >= MIN_WORDS]
    if not near or _share(unknown, total, len(found)) > MAX_UNKNOWN:
        return []
    return near


def lexicon_cut(
    text: str, wm: WordModel, reading: TextReading | None = None
) -> tuple[list[tuple[int, str, str, str]], float]:
    """The words of prose in ``text`` that the English lexicon does not write (``RARE``)
    and that become a common word (``COMMON``) when a piece of 1 to ``MAX_PIECE`` characters
    is taken out of their middle: ``(offset of the piece, the word, the repaired word, the
    piece)``; and the share of the text's other lower-case words of 4+ letters that the
    lexicon calls rare (1.0 when under ``MIN_PROSE`` are left: too little to tell the
    language). Only words the fitted word model does not know are asked (the lexicon is
    loaded then); lower-case words of letters and digits only, or words of letters with one
    capitalised piece inside (``BaWheking``: the repair takes the capital out), written once,
    that are no compound of two words (``lockfile``) and no hexadecimal number.
    ``reading``: the text's, when made."""
    if reading is None:
        reading = TextReading(text, wm)
    if not reading.unseen[0].size:
        return [], 1.0
    toks, which, own = reading.tokens
    out: list[tuple[int, str, str, str]] = []
    for i in which:
        if not 0 < i < len(toks) - 1 or _QUOTED.search(toks[i][1]):
            continue  # (the first and the last word: a window's edges cut words open)
        c = _core(toks[i][1], wm, capital=True, known=reading.known)
        if c is None or own[c[1].lower()] != 1:
            continue
        if not (_lower_word(c[1]) or _capital_inside(c[1])):
            continue
        core = c[1]
        if lexicon.zipf(core) >= RARE or _compound(core) or _derived(core):
            continue
        fix = _repair(core)
        if fix is not None and fix[0][1:].islower():
            word, piece, at_piece = fix
            out.append((toks[i][0] + c[0] + at_piece, core, word, piece))
    if not out:
        return [], 1.0
    prose = [w for w in _WORD.findall(text) if len(w) >= MIN_OWN and w.isalpha() and w.islower()]
    rare = sum(lexicon.zipf(w) < UNCOMMON for w in prose) - len(out)
    left = len(prose) - len(out)
    return out, (max(rare, 0) / left if left >= MIN_PROSE else 1.0)


_HEX = re.compile(r"[0-9a-f]+")
#: A name quoted: in backticks or quotes (``separatevars``).
_QUOTED = re.compile("[`\"'\u2018\u2019\u201c\u201d]")


#: A word with a capitalised piece inside (``BaWheking``, ``sixGoodteen``): lower case
#: around one capital, the word's first letter aside; its parts before and after the
#: capital are not both words.
_CAPITAL_INSIDE = re.compile(r"[A-Za-z][a-z]*[a-z][A-Z][a-z]*[a-z]")


def _capital_inside(core: str) -> bool:
    """One capital inside a word of letters otherwise lower case (the first aside): a
    capitalised piece of another word put in (its repair must take the capital out)."""
    if not (core.isascii() and core.isalpha() and sum(c.isupper() for c in core[1:]) == 1):
        return False
    if _CAPITAL_INSIDE.fullmatch(core) is None:
        return False
    cap = next(i for i in range(1, len(core)) if core[i].isupper())
    # two words joined (``TestQuerying``, ``sendMessage``) are a name, not a word cut open
    return not (lexicon.zipf(core[:cap]) >= RARE and lexicon.zipf(core[cap:]) >= RARE)


def _lower_word(core: str) -> bool:
    return core.isalnum() and core == core.lower() and not _HEX.fullmatch(core)


def _compound(core: str) -> bool:
    """Two words of 3+ letters written together (``lockfile``, ``runbooks``)."""
    return any(
        lexicon.zipf(core[:j]) >= SPLIT and lexicon.zipf(core[j:]) >= SPLIT
        for j in range(3, len(core) - 2)
    )


_PREFIX = [
    "un",
    "re",
    "non",
    "pre",
    "de",
    "dis",
    "mis",
    "over",
    "under",
    "sub",
    "super",
    "multi",
    "inter",
    "auto",
    "co",
]
_SUFFIX = [
    "s",
    "es",
    "ed",
    "ing",
    "er",
    "ers",
    "ly",
    "able",
    "ize",
    "izes",
    "ized",
    "izing",
    "ization",
    "ify",
    "ifying",
    "ified",
    "ness",
    "ment",
    "ments",
    "less",
    "ful",
    "ally",
]


def _derived(core: str) -> bool:
    """A word made of a common one with a prefix or a suffix (``unmerged``,
    ``stringifying``, ``operationalizes``): English makes new words so."""
    stems = [core[len(a) :] for a in _PREFIX if core.startswith(a)]
    stems += [core[: -len(a)] for a in _SUFFIX if core.endswith(a)]
    return any(len(w) >= MIN_OWN and lexicon.zipf(w) >= RARE for w in stems)


def _repair(core: str) -> tuple[str, str, int] | None:
    """The most common word that ``core`` becomes with a piece taken out of its middle
    (the first and the last character stay), the piece and where it starts; None if none
    is common."""
    best: tuple[float, str, str, int] | None = None
    for size in range(1, MAX_PIECE + 1):
        for s in range(1, len(core) - size):
            word = core[:s] + core[s + size :]
            if len(word) < MIN_OWN or size > len(word) or not word.isalpha():
                continue
            z = lexicon.zipf(word)
            if z >= (COMMON if len(word) > MIN_OWN else COMMON_SHORT) and (
                best is None or z > best[0]
            ):
                best = (z, word, core[s : s + size], s)
    return None if best is None else best[1:]


def _junction(cores: list[str], cm: CharModel) -> float:
    """The most improbable 4-gram of the words cut open, in bits (the character model's
    surprisal, a space before and after each word)."""
    s4 = cm.surprisal(codes(" " + " ".join(cores) + " "))[0]
    return float(s4.max()) / 8 if s4.size else 0.0


def other_script(word: str, piece: str) -> bool:
    """Whether ``piece`` holds a letter of another writing system than the Latin ``word``
    it cut open (``serv服务ice``): one such word is evidence on its own."""
    return word.isascii() and any(ch.isalpha() and ch >= _NON_LATIN for ch in piece)


__all__ = [
    "JUNCTION_BITS",
    "MAX_UNKNOWN",
    "MIN_WORDS",
    "SPAN",
    "TextReading",
    "events",
    "lexicon_cut",
    "lexicon_events",
    "model_events",
    "other_script",
    "repaired",
    "unknown_share",
]
