"""Clean text shaped like answers: cut into chunks of answer sizes at line or word
boundaries, and wrapped as an answer would be (fenced code with a sentence of prose, lists,
Markdown tables, an end-of-turn token now and then).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence

from tools.detector.sources import CODE_EXT

MIN_LEN, MAX_LEN = 10, 4000  # short clean answers too: short corruption must not be all


def chunk_len(rng: random.Random) -> int:
    return int(math.exp(rng.uniform(math.log(MIN_LEN), math.log(MAX_LEN))))


def chunks(text: str, rng: random.Random, k: int) -> list[str]:
    """Up to ``k`` pieces of ``text`` of random length, cut at line (else word) boundaries."""
    text = text.replace("\r\n", "\n").strip("\n")
    if len(text) < MIN_LEN:
        return []
    out = []
    for _ in range(k):
        n = chunk_len(rng)
        if len(text) <= n:
            piece = text
        else:
            start = rng.randrange(0, len(text) - n)
            nl = text.rfind("\n", 0, start + 1)
            start = nl + 1 if nl >= 0 and start - nl < 200 else _word_start(text, start)
            end = start + n
            cut = text.rfind("\n", start + n // 2, end)
            end = cut if cut > 0 else _word_start(text, end)
            piece = text[start:end]
        piece = piece.strip("\n")
        if len(piece.strip()) >= MIN_LEN and _textual(piece):
            out.append(piece)
        if len(text) <= n:
            break
    return out


def _word_start(text: str, i: int) -> int:
    j = text.rfind(" ", 0, i)
    return j + 1 if j >= 0 and i - j < 40 else i


def _textual(s: str) -> bool:
    """Not a blob: mostly printable, not one long line of base64/hex."""
    if sum(1 for c in s if not c.isprintable() and c not in "\n\t") > 2:
        return False
    longest = max((len(w) for w in s.split()), default=0)
    return longest < 200


#: End-of-turn tokens a raw output ends with (where they belong: clean).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<end_of_turn>", "</s>")


def wrap(rng: random.Random, kind: str, text: str, prose: list[str]) -> str:
    """Present a chunk as a model would: code fenced with a sentence, prose as lists, and
    now and then the end-of-turn token a raw output ends with."""
    if rng.random() < 0.03:
        return _wrap(rng, kind, text, prose) + rng.choice(END_OF_TURN)
    return _wrap(rng, kind, text, prose)


def _wrap(rng: random.Random, kind: str, text: str, prose: list[str]) -> str:
    lang = CODE_EXT.get("." + kind.split(".")[-1], "") if kind.startswith("code") else ""
    r = rng.random()
    if kind.startswith("code") and r < 0.6:
        before = _sentence(rng, prose)
        after = _sentence(rng, prose) if rng.random() < 0.4 else ""
        fence = f"```{lang}\n{text}\n```"
        return "\n\n".join(x for x in (before, fence, after) if x)
    if kind in ("doc.md", "doc.rst", "doc.txt", "doc.docstring", "metadata", "smollm") and r < 0.15:
        sents = [s for s in re.split(r"(?<=[.!?])\s+", text.replace("\n", " ")) if s]
        if len(sents) >= 3:
            mark = rng.choice(["- ", "* ", "1. "])
            return "\n".join(
                (f"{i + 1}. " if mark == "1. " else mark) + s for i, s in enumerate(sents)
            )
    return text


def _sentence(rng: random.Random, prose: list[str]) -> str:
    if not prose:
        return ""
    p = rng.choice(prose)
    sents = [s.strip() for s in re.split(r"(?<=[.!?:])\s+", p) if 20 <= len(s.strip()) <= 200]
    return rng.choice(sents) if sents else ""


def table(rng: random.Random, rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in r) + " |")
    return "\n".join(lines)
