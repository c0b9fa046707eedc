"""A second look at the text detector's salad where it is known to be weak.

The fitted detector learned clean text from documentation. Real agent answers are other
text, and on them three kinds of healthy output draw most of its false alarms (measured on real
agent turns by whole source, docs/detector.md):

* **prose in one writing system besides Latin, with code in it**: Chinese, Japanese or
  Korean (or Cyrillic, Arabic...) explanations full of file names, identifiers and numbers.
  The character model has seen little of either mixed with the other. Salad made by a broken
  cache mixes *scripts* (sub-word pieces of several writing systems), or debris, runs and
  symbols that the hand-written rules see; this text has none of them.
* **an emoji a logger or a decoder turned into U+FFFD**: a character outside the Basic
  Multilingual Plane (most emoji) is two UTF-16 code units; software that splits the pair
  writes two replacement characters where the symbol stood (a heading's or a bullet's first
  mark, between spaces). A broken detokenizer puts them inside words and in runs of any
  length.
* **ordinary words, Latin letters only, that the character model finds improbable**: short
  English (or Spanish...) prose with file names, bold headings, curly quotes, a list of test
  names. The character model alone calls it salad; no hand-written rule sees anything, and
  nearly every word is one clean text uses. Salad of one script glues sub-word pieces into
  words no text uses, several in a row; a few unknown words (names, identifiers) in every
  eight are prose.

``second_look`` acquits a ``token_salad`` finding of such text when the hand-written rules
saw nothing of weight in it (the third kind: nothing at all); ``emoji_fffd`` gives the text
with those replacement characters as a neutral symbol, for the detector to read.

A loop is a fact one can point to: a ``repetition`` finding in whose window the rules found
no repetition at all (no loop, drift, run) is the fitted model's guess from the text's look,
and on agent text that look is a list (file names, test names, one per line): acquitted.
And the other way round, ``loop_to_the_end`` names one exactly: the same span written four
times or more back to back until the output ends (a model stuck in a loop until the token
limit cut it). That is evidence of a loop, not of whose loop: a small model's greedy answers
end so on their own (SmolLM2-135M on llama.cpp: 77 of 2,400 healthy answers), so such a turn
stays a suspect until an oracle (a lone re-send, another variant's bytes, the judge) decides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from harness.verdict.detector import scripts as S
from harness.verdict.detector.chars import Chars
from harness.verdict.detector.fitted import model
from harness.verdict.detector.fitted.charmodel import codes
from harness.verdict.detector.fitted.wordmodel import words as word_hashes
from harness.verdict.detector.masking import without_markup
from harness.verdict.detector.text import REPETITION_SIGNALS
from harness.verdict.reasoning import literal_mask

#: Rule signals that are no evidence on their own in such text: the character model's
#: surprisal and its P (what is being second-guessed), and a closing quote or a bracket
#: glued to a word (CJK prose quotes names and writes full-width brackets without spaces).
_WEAK = frozenset({"char_surprisal", "p_corrupted", "glued_punctuation"})
#: The fitted model's own readings, in every finding's signals: no rule's.
_MODEL = frozenset({"char_surprisal", "p_corrupted"})
#: Below this sum of the other rule signals in the deciding window the rules saw nothing of
#: weight (their own threshold is 0.7).
RULES_QUIET = 0.5
#: Writing systems that go together in one language's text (besides Latin and Greek).
_FAMILIES = ({S.HAN, S.KANA}, {S.HAN, S.HANGUL})
#: Two replacement characters standing for one astral symbol (a split surrogate pair), no
#: letter, digit or other replacement character on either side.
_FFFD_SYMBOL = re.compile(r"(?<![^\W_])(?<!\ufffd)\ufffd\ufffd(?![^\W_]|\ufffd)")
_FFFD = "\ufffd"


def emoji_fffd(text: str) -> str:
    """``text`` with each pair of replacement characters that stands where a symbol stands
    (``_FFFD_SYMBOL``) made two bullets (same length), the others left as they are."""
    if _FFFD not in text:
        return text
    return _FFFD_SYMBOL.sub(lambda m: "\u2022" * len(m.group(0)), text)


def one_script_family(text: str) -> bool:
    """Whether the letters of ``text`` are Latin (and Greek) plus at most one other writing
    system (or a family that goes together: Chinese with Japanese kana, Chinese with Korean),
    with no script switch inside a word that only salad makes; at least one non-Latin."""
    ch = Chars(text)
    if ch.ascii:
        return False
    ids = S.script_ids_of(ch)
    present = set(np.unique(ids[ids >= S.LATIN]).tolist()) - {S.LATIN, S.FWLATIN, S.GREEK}
    if not present:
        return False
    if len(present) > 1 and present not in _FAMILIES:
        return False
    pos, _ = S.switch_events_near(ids, ch.wide)
    return not pos.size


#: At most this many words clean text does not use in any 8 neighbouring words of ordinary
#: prose (``ordinary_words``).
UNSEEN_IN_8 = 3
#: ... and none of them longer than this: glued sub-word pieces make words longer than any a
#: language has (a name in code spans is a name, not counted).
LONGEST_UNSEEN = 20
#: Prose: letters are at least this share of the characters besides white space (a regex,
#: a hex dump or a matrix of numbers is not; agent prose with code in it is 0.75 or more).
PROSE_LETTERS = 0.7


def latin_only(text: str) -> bool:
    """Whether every letter of ``text`` is Latin (accents included): one writing system."""
    ch = Chars(text)
    if ch.ascii:
        return True
    ids = S.script_ids_of(ch)
    present = set(np.unique(ids[ids >= S.LATIN]).tolist())
    return present <= {S.LATIN}


def ordinary_words(text: str) -> bool:
    """Whether ``text`` is prose (``PROSE_LETTERS``) whose words are ordinary: outside code
    spans and fences, no 8 neighbouring words hold more than ``UNSEEN_IN_8`` words the
    fitted word model's clean text does not use (a shorter text: no larger a share), and none
    of those is longer than ``LONGEST_UNSEEN``. Tool-call markup is left out."""
    body, _ = without_markup(text)
    ink = len(body) - sum(c.isspace() for c in body)
    if not ink or sum(c.isalpha() for c in body) < PROSE_LETTERS * ink:
        return False
    body = literal_mask(body)
    orig = np.frombuffer(body.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    wide = not body.isascii()
    h, length = word_hashes(codes(orig, wide), wide)
    if not h.size:
        return False
    unseen = model.load().words.unseen(h)[0].astype(np.int64)
    if int((unseen * length).max()) > LONGEST_UNSEEN:
        return False
    if unseen.size <= 8:  # fewer words: the same share
        return int(unseen.sum()) * 8 <= UNSEEN_IN_8 * unseen.size
    c = np.concatenate(([0], unseen.cumsum()))
    return int((c[8:] - c[:-8]).max()) <= UNSEEN_IN_8


#: A span of 8-200 characters, then at least three more copies of it (whitespace between),
#: up to the end of the output.
_LOOP_TO_END = re.compile(r"(\S.{7,199}?)(?:\s*\1){3,}\s*\Z", re.S)
_LOOP_TAIL = 4000  # the characters of the end searched (a loop cut by the limit is there)


def loop_to_the_end(text: str) -> dict[str, object] | None:
    """The span and how many times it repeats when ``text`` ends in a loop of one span
    written back to back four times or more (with letters in it: not a rule line of one
    character), else None."""
    tail = text[-_LOOP_TAIL:]
    m = _LOOP_TO_END.search(tail)
    if m is None:
        return None
    span = m.group(1)
    if sum(c.isalpha() for c in span) < 2 or len(set(span.strip())) < 2:
        return None
    copies = len(re.findall(re.escape(span), m.group(0)))
    return {"span": span[:80], "copies": copies}


def second_look(text: str, label: str, signals: Mapping[str, float]) -> str | None:
    """Why a finding of ``text`` is acquitted, or None when it stands."""
    if label == "repetition":
        if not REPETITION_SIGNALS.intersection(signals):
            return "a loop with nothing repeated: no repetition signal of the rules"
        return None
    if label != "token_salad":
        return None
    rules = sum(float(v) for k, v in signals.items() if k not in _WEAK)
    if rules >= RULES_QUIET:
        return None
    if one_script_family(text):
        return "prose in one writing system with code in it, no salad signal of the rules"
    if not set(signals) - _MODEL and latin_only(text) and ordinary_words(text):
        return "ordinary words of one writing system, no signal of the rules"
    return None
