"""One text seen as arrays: the byte view every signal of the detector reads.

``Chars(text).b7`` is the text's ASCII bytes with every non-ASCII character replaced by
``WIDE`` (0x7F); ``cls(name)`` is a boolean array per character for one class of
``_CLASSES`` (punctuation, letters, clause marks, ...). Two ``bytes.translate`` calls give
every class bit at once, so each class is one AND away: C speed, one byte per character (a
short text takes one translate per class instead: fewer numpy calls).
Code points (``codes``) and the positions of the non-ASCII characters (``wide``) are
computed when a signal asks for them.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]
#: Characters markdown and ASCII art draw rules with: runs of them are not loops.
RULE_CHARS = set("-=_*#~.·─━═+|/\\<>`'\"")
#: The punctuation of JSON and paths: dense in clean data, not soup.
SOUP_NORMAL = set('{}[]":,.-_/')


def _chars(chars: str | Iterable[int]) -> set[int]:
    return {ord(c) if isinstance(c, str) else c for c in chars}


_PUNCT_SET = {*range(33, 48), *range(58, 65), *range(91, 97), *range(123, 127)}
WIDE = 127  # every non-ASCII character is this byte in ``Chars.b7``
#: Character classes of the ASCII bytes (and of WIDE: "some non-ASCII character").
_CLASSES: dict[str, set[int]] = {
    "punct": _PUNCT_SET,
    "odd": {c for c in _PUNCT_SET if chr(c) not in SOUP_NORMAL},
    # what ends a run of ASCII soup: anything but an ASCII letter, digit or punctuation
    "soup_sep": {c for c in range(256) if not (33 <= c <= 126)},
    "glue": _chars("?!;#~"),
    # marks that no word of any language holds between two of its letters, unlike
    # "R&D", "and/or", "Ctrl+C", "x=y", "a*b", "don't", "re-run", "x_1", "f(x)"
    "glue_weak": _chars('"`|^$%@)]}'),
    "letter_or_wide": {*range(65, 91), *range(97, 123), WIDE},
    "low": set(range(97, 123)),
    "up": set(range(65, 91)),
    "sandwich": _chars("?!;#~$@^\\|&*=+%"),
    "bang": _chars("?!"),
    "semi": _chars(";:,"),
    "clause": _chars("?!;:,."),
    "wide": {WIDE},
    "run_ok": {
        c for c in range(256) if not (chr(c).isspace() or chr(c).isdigit() or chr(c) in RULE_CHARS)
    },
    "digit": set(range(48, 58)),
    "dot": _chars("."),
    "space": _chars(" \t\n\r\f\v"),
    "alnum": {*range(48, 58), *range(65, 91), *range(97, 123)},
}
_NAMES = list(_CLASSES)
_BIT = {name: (i // 8, np.uint8(1 << (i % 8))) for i, name in enumerate(_NAMES)}
#: Two ``bytes.translate`` tables: per byte value, the class bits (eight per table).
_FLAG_TABLES = tuple(
    bytes(
        sum(1 << (i % 8) for i, name in enumerate(_NAMES) if i // 8 == t and c in _CLASSES[name])
        for c in range(256)
    )
    for t in range((len(_NAMES) + 7) // 8)
)
#: One table per class (1 for its bytes, else 0), for short texts: one translate costs less
#: than two numpy calls there, more on long texts.
_TABLES = {name: bytes(c in members for c in range(256)) for name, members in _CLASSES.items()}
_SHORT = 2048


class Chars:
    """One text seen as arrays: ASCII bytes (non-ASCII as 0x7F) and, if needed, code points.

    ``cls(name)`` is a boolean array per character for one class of ``_CLASSES``: two
    ``bytes.translate`` calls give every class bit at once, each class is one AND away.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.ascii = text.isascii()
        self._cls: dict[str, BoolArray] = {}
        if self.ascii:
            self.b7 = text.encode("ascii")
        else:
            # code points of 127 and up become 127 (WIDE; DEL stays itself)
            self.b7 = np.minimum(self.codes, WIDE).astype(np.uint8).tobytes()

    @cached_property
    def codes(self) -> npt.NDArray[np.uint32]:
        """Code points (uint32); for ASCII text the bytes widened."""
        if self.ascii:
            return np.frombuffer(self.b7, dtype=np.uint8).astype(np.uint32)
        return np.frombuffer(self.text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)

    @cached_property
    def b(self) -> npt.NDArray[np.uint8]:
        return np.frombuffer(self.b7, dtype=np.uint8)

    @cached_property
    def _flags(self) -> tuple[npt.NDArray[np.uint8], ...]:
        return tuple(np.frombuffer(self.b7.translate(t), dtype=np.uint8) for t in _FLAG_TABLES)

    @cached_property
    def wide(self) -> npt.NDArray[np.int64]:
        """Positions of the non-ASCII characters."""
        if self.ascii:
            return np.zeros(0, dtype=np.int64)
        wide: np.ndarray[Any, np.dtype[np.int64]] = (self.b == WIDE).nonzero()[0]
        return wide

    def cls(self, name: str) -> BoolArray:
        """Per character: does its (ASCII) byte belong to the class ``name``."""
        got = self._cls.get(name)
        if got is None:
            if len(self.b7) < _SHORT:
                got = np.frombuffer(self.b7.translate(_TABLES[name]), dtype=np.bool_)
            else:
                t, bit = _BIT[name]
                got = (self._flags[t] & bit) != 0
            self._cls[name] = got
        return got

    def __len__(self) -> int:
        return len(self.text)
