"""How often ordinary English writes a word: the ``wordfreq`` lexicon, loaded on first use.

The fitted word model (``fitted.wordmodel``) was counted on documentation and code: it knows
``kwargs`` and not ``purchase``. Whether a word of prose is a real word is a question about
the language, so it is asked of a lexicon counted on the language at large (wordfreq: web
text, subtitles, books, news, Wikipedia; 321,000 English words).

The lexicon is imported and read the first time a text has a word to ask about (about 0.4 s
and 60 MB, once a process): ``harness --help`` and text whose words the word model knows
never load it.
"""

from __future__ import annotations

import math
from functools import cache

#: The language asked.
LANG = "en"


@cache
def _table() -> dict[str, float]:
    import wordfreq

    table: dict[str, float] = wordfreq.get_frequency_dict(LANG)
    return table


def zipf(word: str) -> float:
    """The Zipf frequency of ``word`` (lower-cased) in English: log10 of its uses a billion
    words; 0 for a word the lexicon does not have. ``the`` is 7.7, ``purchase`` 4.7, a rare
    word 1 to 2."""
    f = _table().get(word.lower(), 0.0)
    return math.log10(f) + 9.0 if f > 0 else 0.0


__all__ = ["LANG", "zipf"]
