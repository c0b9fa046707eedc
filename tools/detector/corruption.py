"""The corruption processes of the corpus: a clean text (and another one) -> (label, kind,
corrupted text), made with the real tokenizer's pieces; ``script_pools`` sorts the
vocabulary's pieces by writing system.
"""

from __future__ import annotations

import random
import re
import unicodedata

from tools.detector.tokenizer import Tokenizer

SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<|eot_id|>",
    "[INST]",
    "<|assistant|>",
    "<｜end▁of▁sentence｜>",
    "<|start_header_id|>",
    "<unk>",
    "<pad>",
]


def _script(c: str) -> str:
    try:
        return unicodedata.name(c).split()[0]
    except ValueError:
        return "?"


def _cut(rng: random.Random, toks: list[str]) -> int:
    return rng.randrange(0, max(1, len(toks) * 3 // 4))


def corrupt(
    rng: random.Random, text: str, other: str, tk: Tokenizer, pools: dict[str, list[str]]
) -> tuple[str, str, str] | None:
    """(label, kind, corrupted text) made from ``text`` (``other``: another clean text)."""
    kinds = [
        "interleave",
        "vocab",
        "swap",
        "digits",
        "list_loop",
        "digit_loop",
        "line_loop",
        "sentence_loop",
        "doubled_name",
        "words",
        "short_salad",
        "special",
        "mojibake",
        "truncate",
        "glue",
        "multi_vocab",
        "multi_vocab",
        "mixed_short",
        "mixed_short",
        "unit_loop",
        "word_stutter",
    ]
    kind = rng.choice(kinds)
    toks = tk.encode(text[:3000])
    if len(toks) < 4:
        return None
    if kind == "interleave":
        o = tk.encode(other[:2000])
        i = _cut(rng, toks)
        mixed: list[str] = []
        a, b = toks[i:], o[rng.randrange(0, max(1, len(o) // 2)) :]
        n = rng.randint(30, 200)
        while len(mixed) < n and (a or b):
            src = a if (rng.random() < 0.5 and a) or not b else b
            k = rng.randint(1, 3)
            mixed.extend(src[:k])
            del src[:k]
        return "salad", kind, tk.decode(toks[:i] + mixed)
    if kind == "vocab":
        i = _cut(rng, toks)
        n = rng.randint(5, 80)
        noise = [rng.choice(tk.vocab) for _ in range(n)]
        tail = toks[i:] if rng.random() < 0.3 else []
        return "salad", kind, tk.decode(toks[:i] + noise + tail)
    if kind == "multi_vocab":
        # a multilingual model's vocabulary: pieces of 1-6 characters of texts in other
        # languages and scripts, glued with and without spaces, after a clean start or alone
        src = [t for t in others_of(pools) if t] or [other]
        pieces = []
        for _ in range(rng.randint(6, 60)):
            t = rng.choice(src)
            k = rng.randrange(0, max(1, len(t) - 6))
            pieces.append(t[k : k + rng.randint(1, 6)].replace("\n", " "))
            if rng.random() < 0.3:
                pieces.append(" ")
        junk = "".join(pieces).strip()
        i = _cut(rng, toks) if rng.random() < 0.6 else 0
        return "salad", kind, (tk.decode(toks[:i]) + " " + junk).strip()
    if kind == "swap":
        o = tk.encode(other[:2000])
        i = _cut(rng, toks)
        out, rest = toks[:i], toks[i:]
        for _ in range(rng.randint(3, 6)):
            j = rng.randrange(0, max(1, len(o) - 5))
            out += o[j : j + rng.randint(5, 20)] + rest[: rng.randint(2, 12)]
            rest = rest[rng.randint(2, 12) :]
        return "salad", kind, tk.decode(out)
    if kind == "digits":
        i = rng.randrange(0, len(text))
        span = list(text[i : i + rng.randint(60, 300)])
        for _ in range(max(8, len(span) // rng.randint(2, 4))):
            span.insert(rng.randrange(0, len(span) + 1), rng.choice("0123456789\n\n\n"))
        return "salad", kind, text[:i] + "".join(span)
    if kind == "list_loop":
        items = [w for w in re.findall(r"\w[\w'-]{2,}(?: \w[\w'-]+)?", text)] or ["item"]
        item = rng.choice(items)
        start = rng.randint(1, 9)
        sep = rng.choice(["\n", " ", "\n\n"])
        loop = sep.join(f"{k}. {item}" for k in range(start, start + rng.randint(6, 30)))
        return "repetition", kind, text[: rng.randrange(0, len(text))] + "\n" + loop
    if kind == "digit_loop":
        unit = rng.choice(
            [
                "0",
                "00",
                "0.00000000001",
                "1",
                "10",
                "0.5",
                "9",
                "12",
                str(rng.randint(0, 999)),
                "0" * rng.randint(3, 9) + "1",
            ]
        )
        sep = rng.choice(["", "", " ", ", ", "\n"])
        loop = sep.join([unit] * rng.randint(12, 80))
        return "repetition", kind, text[: rng.randrange(0, len(text))] + loop
    if kind == "line_loop":
        lines = [ln for ln in text.split("\n") if ln.strip()]
        k = rng.randint(1, min(3, len(lines)))
        j = rng.randrange(0, len(lines) - k + 1)
        block = "\n".join(lines[j : j + k])
        cut = text.find(block) + len(block)
        return "repetition", kind, text[:cut] + ("\n" + block) * rng.randint(4, 10)
    if kind == "sentence_loop":
        sents = re.split(r"(?<=[.!?。])\s*", text)
        s = rng.choice([x for x in sents if len(x) > 10] or [text[:80]])
        sep = rng.choice([" ", "\n", ""])
        return "repetition", kind, text[: text.find(s) + len(s)] + (sep + s) * rng.randint(4, 15)
    if kind == "doubled_name":
        names = re.findall(r"\b[a-z]+_[a-z_]+\b", text) or ["get_weather", "skills_list"]
        nm = rng.choice(names)
        forms = [f'{{"name": "{nm}{nm}", "arguments": {{}}}}', f"{nm}{nm}", f"{nm}{nm}({nm})"]
        return "salad", kind, text[: rng.randrange(0, len(text))] + "\n" + rng.choice(forms)
    if kind == "words":
        spans = list(re.finditer(r"\w{3,}", text))
        if len(spans) < 5:
            return None
        edited = text
        j = rng.randrange(0, len(spans))
        near = spans[j : j + rng.randint(10, 20)]
        for m in sorted(
            rng.sample(near, min(len(near), rng.randint(4, 10))), key=lambda m: -m.start()
        ):
            junk = "".join(rng.choice(tk.vocab).lstrip("Ġ") for _ in range(rng.randint(2, 4)))
            edited = edited[: m.start()] + tk.decode([junk]) + edited[m.end() :]
        return "salad", kind, edited
    if kind == "short_salad":
        sc = _script(next((c for c in text if c.isalpha()), "a"))
        pool = pools["LATIN"]
        if sc != "LATIN":  # pieces of 1-4 characters of the texts themselves
            both = text + other
            pool = [
                both[k : k + rng.randint(1, 4)]
                for k in (rng.randrange(0, len(both)) for _ in range(200))
            ]
        n = rng.randint(4, 25)
        glue = rng.random() < 0.7 and sc == "LATIN"
        s = "".join(
            rng.choice(pool).lstrip() if glue and rng.random() < 0.6 else rng.choice(pool)
            for _ in range(n)
        ).strip()[:150]
        return ("salad", kind, s) if len(s) >= 10 else None
    if kind == "mixed_short":
        return _mixed_short(rng, text, pools)
    if kind == "unit_loop":
        # one mark, or a syllable of one of the text's words, repeated inside the word or
        # after it: a sampler stuck on one token (``!!!!``, ``bunbunbunbun``, ``。。。。``)
        words = re.findall(r"[^\W\d_]{3,}", text) or ["word"]
        w = rng.choice(words)
        k = rng.randrange(0, max(1, len(w) - 1))
        unit = rng.choice([w[k : k + rng.randint(1, 4)], rng.choice("!?.;*~。、！？…-")])
        i = text.find(w) + len(w) if rng.random() < 0.6 else rng.randrange(0, len(text) + 1)
        loop = unit * rng.randint(max(8, 40 // len(unit)), max(12, 240 // len(unit)))
        return "repetition", kind, text[:i] + loop + (text[i : i + rng.randint(0, 80)])
    if kind == "word_stutter":
        # one word said again and again (``The The The The``)
        words = re.findall(r"[^\W\d_]+", text) or ["the"]
        w = rng.choice(words[:40])
        i = text.find(w) + len(w) if rng.random() < 0.7 else 0
        sep = rng.choice([" ", " ", ", ", "\n"])
        return "repetition", kind, text[:i] + (sep + w) * rng.randint(6, 40)
    if kind == "special":
        i = rng.randrange(0, len(text))
        sp = rng.choice(SPECIALS)
        junk = sp if rng.random() < 0.5 else sp + rng.choice(["assistant\n", "user\n", ""])
        after = text[i : i + rng.randint(0, 200)]
        if not after.strip():  # one end-of-turn token at the very end is where it belongs
            after = " " + other[: rng.randint(10, 120)]
        return "salad", kind, text[:i] + junk + after
    if kind == "mojibake":
        if all(ord(c) < 128 for c in text):
            return None
        wide = [k for k, c in enumerate(text) if ord(c) >= 128]
        i = rng.randrange(0, wide[len(wide) // 2] + 1)
        enc = rng.choice(["latin-1", "cp1252"])
        seg = text[i:].encode("utf-8").decode(enc, "replace")
        return "salad", kind, text[:i] + seg
    if kind == "truncate":
        raw = text.encode("utf-8")
        cuts = [k for k in range(1, len(raw)) if 0x80 <= raw[k] < 0xC0]
        if not cuts:
            return None
        pos = sorted(rng.sample(cuts, min(len(cuts), rng.randint(1, 6))))
        parts, last = [], 0
        for p in pos:
            parts.append(raw[last:p])
            last = p + rng.randint(1, 2)
        parts.append(raw[last:])
        return "salad", kind, b"".join(parts).decode("utf-8", "replace")
    # glue: English (or the text's) sub-word pieces glued together
    pieces = [t for t in toks if len(t) > 2]
    if len(pieces) < 4:
        return None
    n = rng.randint(6, 30)
    junk = "".join(
        rng.choice(pieces).lstrip("Ġ") if rng.random() < 0.7 else rng.choice(pieces)
        for _ in range(n)
    )
    i = _cut(rng, toks)
    return "salad", kind, tk.decode(toks[:i]) + " " + tk.decode([junk])


def _mixed_short(
    rng: random.Random, text: str, pools: dict[str, list[str]]
) -> tuple[str, str, str] | None:
    """Short salad (10-150 characters) that mixes scripts inside words, as a multilingual
    model's broken sampler writes it: pieces of 1-4 characters of texts in two or three
    scripts, fragments of the text's own identifiers and numbers, clause marks and symbols
    glued between them, sometimes after a short clean start of the text."""
    src = [t for t in others_of(pools) if t] or [text]
    by_script: dict[str, list[str]] = {}
    for t in src:
        c = next((ch for ch in t if ch.isalpha()), None)
        if c:
            by_script.setdefault(_script(c), []).append(t)
    scripts = sorted(by_script)
    picks = rng.sample(scripts, min(len(scripts), rng.randint(2, 3)))
    texts = [rng.choice(by_script[sc]) for sc in picks] + [text]
    idents = re.findall(r"[A-Za-z_][A-Za-z0-9_]{2,}|\d+", text) or ["id"]
    pieces = []
    for _ in range(rng.randint(4, 30)):
        r = rng.random()
        if r < 0.6:
            t = rng.choice(texts)
            k = rng.randrange(0, max(1, len(t) - 4))
            pieces.append(t[k : k + rng.randint(1, 4)].replace("\n", ""))
        elif r < 0.8:
            idt = rng.choice(idents)
            k = rng.randrange(0, max(1, len(idt) - 2))
            pieces.append(idt[k : k + rng.randint(2, 6)])
        else:
            pieces.append(rng.choice("?;:$#!,.、。？的_=()[]{}<>'\"`"))
        if rng.random() < 0.15:
            pieces.append(" ")
    junk = "".join(pieces).strip()[: rng.randint(10, 150)]
    start = ""
    if rng.random() < 0.4:
        start = text[: rng.randint(0, 60)]
        start = start[: start.rfind(" ") + 1] if " " in start else start
    s = (start + junk).strip()
    return ("salad", "mixed_short", s) if len(junk) >= 8 else None


def others_of(pools: dict[str, list[str]]) -> list[str]:
    """Texts in many scripts, collected while building (``pools["_texts"]``)."""
    return pools.get("_texts", [])


def script_pools(tk: Tokenizer) -> dict[str, list[str]]:
    """Vocabulary pieces by script of their first letter (decoded)."""
    pools: dict[str, list[str]] = {}
    for v in tk.vocab:
        s = tk.decode([v])
        if "\ufffd" in s:
            continue
        c = next((ch for ch in s if ch.isalpha()), None)
        if c:
            pools.setdefault(_script(c), []).append(s)
    return pools
