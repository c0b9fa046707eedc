"""Writing systems of each character, and the script switches that only salad makes.

The script of a code point comes from its Unicode name (``unicodedata``): the table is built
once, lazily, for the first three planes. Texts are mapped to arrays of script ids with numpy
(``str.encode("utf-32")`` + one table lookup), so the cost is linear and vectorized.

Clean mixed text switches script at word or quote boundaries. Inside one word (two letters
touching) only a few switches are normal: Chinese, Japanese, Thai and similar scripts that
do not separate words with spaces glue Latin names to their own letters, Korean particles
attach to Latin words, Greek letters touch Latin ones in formulas and units. Every other
letter-to-letter switch is a salad event.
"""

from __future__ import annotations

import unicodedata
from functools import cache

import numpy as np
import numpy.typing as npt

from harness.verdict.detector.chars import Chars

NONLETTER = 0
NEUTRAL = 1  # letters without a script worth counting (math alphanumerics, modifiers, ...)
INHERIT = 2  # combining marks: take the script of the letter before them
LATIN, FWLATIN, GREEK, HAN, KANA, HANGUL = 3, 4, 5, 6, 7, 8

_PLANES = 0x30000
_FIXED = {
    "LATIN": LATIN,
    "GREEK": GREEK,
    "CJK": HAN,
    "IDEOGRAPHIC": HAN,
    "HIRAGANA": KANA,
    "KATAKANA": KANA,
    "KATAKANA-HIRAGANA": KANA,
    "HANGUL": HANGUL,
}
_NEUTRAL_WORDS = frozenset(
    {
        "",
        "MATHEMATICAL",
        "MODIFIER",
        "DOUBLE-STRUCK",
        "SCRIPT",
        "BLACK-LETTER",
        "SUPERSCRIPT",
        "SUBSCRIPT",
        "VERTICAL",
        "PLANCK",
        "TURNED",
        "FEMININE",
        "MASCULINE",
        "MICRO",
        "EULER",
        "OHM",
        "KELVIN",
        "ANGSTROM",
        "ALEF",
        "BET",
        "GIMEL",
        "DALET",
        "INFORMATION",
        "ROMAN",
        "MUSICAL",
        "CARON",
        "ARABIC-INDIC",
    }
)
_INHERIT_WORDS = frozenset({"COMBINING", "VARIATION", "ZERO"})
#: Scripts written without spaces between words (besides the CJK family).
_SPACELESS_NAMES = ("THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN", "BOPOMOFO", "YI")


@cache
def _tables() -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32], dict[str, int]]:
    ids: dict[str, int] = {}
    table = np.zeros(_PLANES + 1, dtype=np.uint8)
    table[_PLANES] = NEUTRAL
    big = ((0x3400, 0x4DC0), (0x4E00, 0xA000), (0x20000, 0x2FA20))
    for lo, hi in big:
        table[lo:hi] = HAN
    table[0xAC00:0xD7A4] = HANGUL
    next_id = HANGUL + 1
    for cp in range(_PLANES):
        if table[cp]:
            continue
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat[0] not in "LM":
            continue
        words = unicodedata.name(ch, "").split(" ")
        head = words[0]
        if head in ("FULLWIDTH", "HALFWIDTH") and len(words) > 1:
            head = {"LATIN": "FWLATIN"}.get(words[1], words[1])
        if head == "FWLATIN":
            table[cp] = FWLATIN
        elif head in _FIXED:
            table[cp] = _FIXED[head]
        elif head in _INHERIT_WORDS or (cat[0] == "M" and head in _NEUTRAL_WORDS):
            table[cp] = INHERIT
        elif head in _NEUTRAL_WORDS or cp == 0x0640:  # 0640: Arabic tatweel joins, no letter
            table[cp] = NEUTRAL
        else:
            if head not in ids:
                if next_id >= 255:
                    table[cp] = NEUTRAL
                    continue
                ids[head] = next_id
                next_id += 1
            table[cp] = ids[head]
    names = {
        "LATIN": LATIN,
        "FWLATIN": FWLATIN,
        "GREEK": GREEK,
        "HAN": HAN,
        "KANA": KANA,
        "HANGUL": HANGUL,
        **ids,
    }
    return table, _pair_weights(next_id, names), names


def _pair_weights(n: int, names: dict[str, int]) -> npt.NDArray[np.float32]:
    """Salad weight of two touching letters of scripts (a, b)."""
    cjk = {HAN, KANA} | {names[s] for s in ("BOPOMOFO", "YI") if s in names}
    spaceless = cjk | {names[s] for s in _SPACELESS_NAMES if s in names}
    w = np.full((256, 256), 0.8, dtype=np.float32)
    real = range(LATIN, n)
    for a in real:
        w[a, a] = 0.0
    for a in spaceless:
        for b in spaceless:
            w[a, b] = 0.0 if (a in cjk and b in cjk) or a == b else 0.6
    for a in spaceless | {HANGUL}:
        w[a, LATIN] = w[LATIN, a] = 0.0
        w[a, FWLATIN] = w[FWLATIN, a] = 0.0 if a in cjk else 0.6
    w[LATIN, GREEK] = w[GREEK, LATIN] = 0.1
    w[HANGUL, HAN] = w[HAN, HANGUL] = 0.3
    w[LATIN, FWLATIN] = w[FWLATIN, LATIN] = 0.5
    w[:LATIN, :] = 0.0
    w[:, :LATIN] = 0.0
    return w


_ASCII_IDS = bytes(LATIN if chr(c).isascii() and chr(c).isalpha() else 0 for c in range(256))


def script_ids(text: str) -> npt.NDArray[np.uint8]:
    """One script id per character of ``text`` (combining marks take their base's script)."""
    return script_ids_of(Chars(text))


def script_ids_of(ch: Chars) -> npt.NDArray[np.uint8]:
    """``script_ids`` from a text's ``Chars`` view: ASCII by byte table, the rest looked up."""
    ids = np.frombuffer(ch.b7.translate(_ASCII_IDS), dtype=np.uint8)
    if ch.ascii:
        return ids
    table, _, _ = _tables()
    ids = ids.copy()
    wide = ch.wide
    ids[wide] = table[np.minimum(ch.codes[wide], _PLANES)]
    inherit = ids == INHERIT
    if np.count_nonzero(inherit):
        idx = np.where(inherit, 0, np.arange(ids.size))
        np.maximum.accumulate(idx, out=idx)
        ids = ids[idx]
        ids[inherit & (idx == 0) & (ids == INHERIT)] = NEUTRAL
    return ids


def switch_events(
    ids: npt.NDArray[np.uint8],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Positions (of the second letter) and weights of suspicious mid-word script switches."""
    _, weights, _ = _tables()
    if ids.size < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    a, b = ids[:-1], ids[1:]
    w = weights[a, b]
    pos = (w > 0).nonzero()[0]
    return pos + 1, w[pos]


def switch_events_near(
    ids: npt.NDArray[np.uint8], wide: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """``switch_events`` when only the non-ASCII positions ``wide`` can switch script (two
    ASCII letters are both Latin): looks at the pairs around them only."""
    if ids.size < 2 or not wide.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    _, weights, _ = _tables()
    near = np.zeros(ids.size + 1, dtype=bool)
    near[wide] = True
    near[wide + 1] = True
    near[0] = False
    pos = near[: ids.size].nonzero()[0]
    w = weights[ids[pos - 1], ids[pos]]
    keep = (w > 0).nonzero()[0]
    return pos[keep].astype(np.int64), w[keep]


def scripts_present(ids: npt.NDArray[np.uint8], wide: npt.NDArray[np.int64]) -> int:
    """How many real scripts the letters of the text use (Latin counted from ASCII too)."""
    counts = np.bincount(ids[wide], minlength=256) if wide.size else np.zeros(256, np.int64)
    present = set(counts.nonzero()[0].tolist())
    if wide.size < ids.size:
        present.add(LATIN)  # cheap upper bound: assume the ASCII part has letters
    return sum(1 for s in present if s >= LATIN)


def variety_events(
    ids: npt.NDArray[np.uint8],
    span: int = 160,
    newlines: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Events where more than three scripts meet within ``span`` characters of one line
    (``newlines``: the sorted offsets of the line breaks). A list of greetings puts one
    script per line; salad mixes them inside a line."""
    letters = (ids >= LATIN).nonzero()[0]
    if letters.size < 4:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    s = ids[letters]
    starts = np.concatenate(([True], s[1:] != s[:-1])).nonzero()[0]
    if starts.size < 4:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    run_pos = letters[starts]
    run_script = s[starts].astype(np.int64)
    k = 8  # look at the runs that follow each run
    m = run_pos.size
    line = (
        newlines.searchsorted(run_pos)
        if newlines is not None and newlines.size
        else np.zeros(m, dtype=np.int64)
    )
    # the runs near a run are a prefix of the ones after it (positions and lines only
    # grow): four scripts need the fourth run near, which few runs have
    row = np.arange(m - 3)
    row = row[(run_pos[row + 3] - run_pos[row] <= span) & (line[row + 3] == line[row])]
    if row.size:  # ... and a line that has four scripts in all
        scripts_of_line = np.unique(line * 256 + run_script) >> 8
        row = row[np.bincount(scripts_of_line)[line[row]] >= 4]
    if not row.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    idx = row[:, None] + np.arange(k)[None, :]
    valid = idx < m
    idx = np.minimum(idx, m - 1)
    near = valid & (run_pos[idx] - run_pos[row, None] <= span) & (line[idx] == line[row, None])
    scr = np.where(near, run_script[idx], -1)
    scr.sort(axis=1)
    distinct = (np.diff(scr, axis=1) != 0).sum(axis=1) + 1 - (scr[:, 0] == -1)
    hit = (distinct >= 4).nonzero()[0]
    # one event per run start that brings the count to four or more
    return run_pos[row[hit]].astype(np.int64), (0.15 * (distinct[hit] - 3)).astype(np.float32)


def script_name(sid: int) -> str:
    _, _, names = _tables()
    for name, value in names.items():
        if value == sid:
            return name
    return "OTHER"
