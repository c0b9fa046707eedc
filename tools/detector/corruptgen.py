"""Make labelled corrupted (and clean) examples from clean seed texts, for the detector eval.

This generator is independent of the simulator's fault model on purpose: the detector must
not be judged by the code that made the faults. Every transform draws from a seeded
``random.Random``, so the output is reproducible.

    python -m tools.detector.corruptgen SEEDS.jsonl OUT.jsonl [--seed N] [--per-seed K]

SEEDS.jsonl holds ``{"id", "text", "label"}`` lines; only ``clean`` ones are used. The pool
of foreign fragments for salad comes from all the seeds together (many scripts), so the
generator itself holds no word list of any language.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

from harness.dialects import dsml

BAR = "\uff5c"
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "</think>",
    "<unk>",
    "<|eot_id|>",
    f"<{BAR}begin\u2581of\u2581sentence{BAR}>",
    "<s>",
    "[PAD]",
    "<|start_header_id|>",
]
RUN_CHARS = "!?,;:@%$&"
_WORD = re.compile(r"\S+")
_SENT = re.compile(r"[^.!?。！？\n]+[.!?。！？]?")

Example = dict[str, str]


class Gen:
    def __init__(self, seeds: list[Example], rng: random.Random) -> None:
        self.seeds = seeds
        self.rng = rng
        self.pool = [s["text"] for s in seeds]

    # ------------------------------------------------------------------ helpers
    def cut(self, text: str, lo: float = 0.3, hi: float = 0.9) -> int:
        """A word boundary somewhere between lo and hi of the text."""
        if len(text) < 20:
            return len(text)
        pos = int(len(text) * self.rng.uniform(lo, hi))
        sp = text.rfind(" ", 0, pos)
        return sp + 1 if sp > 0 else pos

    def fragment(self) -> str:
        """A piece of 1 to 8 characters from a random seed (any script)."""
        t = self.rng.choice(self.pool)
        words: list[str] = _WORD.findall(t) or [t]
        w = self.rng.choice(words)
        n = self.rng.randint(1, min(8, len(w)))
        i = self.rng.randint(0, len(w) - n)
        return w[i : i + n]

    def identifier(self) -> str:
        parts = [self.fragment() for _ in range(self.rng.randint(2, 3))]
        styles: list[Callable[[str], str]] = [str.upper, str.lower, str.capitalize, lambda s: s]
        return "".join(self.rng.choice(styles)(p) for p in parts)

    # ------------------------------------------------------------------ salad
    def script_salad(self, text: str) -> tuple[str, str]:
        k = self.cut(text)
        n = self.rng.randint(8, 40)
        pieces = []
        for _ in range(n):
            glue = "" if self.rng.random() < 0.6 else " "
            pieces.append(self.fragment() + self.fragment() + glue)
        return text[:k] + "".join(pieces), "salad"

    def identifier_soup(self, text: str) -> tuple[str, str]:
        k = self.cut(text)
        soup = " ".join(self.identifier() for _ in range(self.rng.randint(6, 20)))
        return text[:k] + soup, "salad"

    def fragment_soup(self, text: str) -> tuple[str, str]:
        """Monolingual: words of the text itself, shuffled, some glued, some stuttered."""
        words = _WORD.findall(text)
        if len(words) < 12:
            return self.script_salad(text)
        k = self.cut(text, 0.4, 0.8)
        out = []
        for _ in range(self.rng.randint(25, 60)):
            w = self.rng.choice(words)
            r = self.rng.random()
            if r < 0.25:
                w = w + self.rng.choice(words)
            elif r < 0.35 and len(w) > 4:
                j = self.rng.randint(1, len(w) - 3)
                w = w[: j + 3] + w[j:]
            out.append(w)
        return text[:k] + " ".join(out), "salad"

    def ascii_soup(self, text: str) -> tuple[str, str]:
        k = self.cut(text, 0.0, 0.8)
        chars = "".join(chr(c) for c in range(33, 127))
        soup = "".join(self.rng.choice(chars) for _ in range(self.rng.randint(24, 90)))
        return text[:k] + soup, "salad"

    def stray_tokens(self, text: str) -> tuple[str, str]:
        """Fragments of other scripts glued inside words, two to four times, close together."""
        k = self.cut(text, 0.1, 0.7)
        out = text
        for _ in range(self.rng.randint(2, 4)):
            # next letter position after k
            m = re.compile(r"[^\W\d_]{2,}").search(out, k)
            if m is None:
                break
            j = self.rng.randint(m.start() + 1, m.end() - 1)
            frag = self.fragment()
            out = out[:j] + frag + out[j:]
            k = j + len(frag) + self.rng.randint(5, 40)
        return out, "salad"

    def special_debris(self, text: str) -> tuple[str, str]:
        k = self.cut(text, 0.1, 0.95)
        tok = self.rng.choice(SPECIAL)
        if tok in ("<s>",):
            tok = "</s>"
        return text[:k] + tok + text[k:], "salad"

    def fffd(self, text: str) -> tuple[str, str]:
        k = self.cut(text, 0.1, 0.9)
        n = self.rng.randint(2, 4)
        return text[:k] + "\ufffd" * n + text[k + n :], "salad"

    # ------------------------------------------------------------------ repetition
    def sentence_loop(self, text: str) -> tuple[str, str]:
        sents = [s.strip() for s in _SENT.findall(text) if len(s.strip()) > 8]
        if not sents:
            return self.token_loop(text)
        s = self.rng.choice(sents)
        k = self.cut(text, 0.3, 1.0)
        sep = self.rng.choice([" ", "\n", "\n\n"])
        return text[:k] + sep.join([s] * self.rng.randint(4, 15)), "repetition"

    def token_loop(self, text: str) -> tuple[str, str]:
        words = _WORD.findall(text) or ["the"]
        w = self.rng.choice(words)
        k = self.cut(text, 0.2, 1.0)
        sep = self.rng.choice([" ", "\n", ""]) if not w.isascii() else self.rng.choice([" ", "\n"])
        return text[:k] + sep.join([w] * self.rng.randint(8, 40)), "repetition"

    def drift_loop(self, text: str) -> tuple[str, str]:
        sents = [s.strip() for s in _SENT.findall(text) if len(_WORD.findall(s)) >= 5]
        if not sents:
            return self.sentence_loop(text)
        s = self.rng.choice(sents)
        words = _WORD.findall(s)
        reps = []
        alt = [
            self.rng.choice(_WORD.findall(self.rng.choice(self.pool)) or ["x"]) for _ in range(3)
        ]
        for _ in range(self.rng.randint(8, 16)):
            ws = list(words)
            for _ in range(self.rng.randint(1, 2)):
                ws[self.rng.randrange(len(ws))] = self.rng.choice(alt + words)
            reps.append(" ".join(ws))
        k = self.cut(text, 0.3, 1.0)
        return text[:k] + " ".join(reps), "repetition"

    def line_cycle(self, text: str) -> tuple[str, str]:
        sents = [s.strip() for s in _SENT.findall(text) if len(s.strip()) > 5]
        if len(sents) < 2:
            return self.sentence_loop(text)
        n = self.rng.randint(2, min(7, len(sents)))
        i = self.rng.randint(0, len(sents) - n)
        cyc = sents[i : i + n]
        k = self.cut(text, 0.5, 1.0)
        return text[:k] + "\n" + "\n".join(cyc * self.rng.randint(3, 5)), "repetition"

    def char_run(self, text: str) -> tuple[str, str]:
        k = self.cut(text, 0.2, 1.0)
        return text[:k] + self.rng.choice("!?") * self.rng.randint(16, 200), "repetition"

    def special_loop(self, text: str) -> tuple[str, str]:
        k = self.cut(text, 0.0, 1.0)
        return text[:k] + self.rng.choice(SPECIAL) * self.rng.randint(5, 30), "repetition"


# ---------------------------------------------------------------------- tool calls
def _calls(rng: random.Random, n: int, same: bool) -> list[dict[str, object]]:
    names = ["read_file", "search", "get_weather", "run_shell", "list_dir"]
    name = rng.choice(names)
    out: list[dict[str, object]] = []
    for i in range(n):
        nm = name if same else rng.choice(names)
        args: dict[str, object] = {"path": f"src/part_{i}.txt", "limit": rng.randint(1, 100)}
        if rng.random() < 0.5:
            args["options"] = {"recursive": rng.random() < 0.5, "depth": rng.randint(1, 5)}
        out.append({"name": nm, "arguments": args})
    return out


def clean_tool_turn(rng: random.Random, content: str) -> str:
    calls = _calls(rng, rng.randint(1, 5), same=rng.random() < 0.6)
    version = rng.choice(["v4", "v32"])
    return dsml.encode_turn(content, calls, version=version, eos=rng.random() < 0.5)


def malformed_tool_turn(rng: random.Random, content: str) -> str:
    calls = _calls(rng, rng.randint(1, 3), same=False)
    version = rng.choice(["v4", "v32"])
    text = dsml.encode_turn(content, calls, version=version, eos=False)
    block = dsml.BLOCKS[version]
    mutations: list[Callable[[str], str]] = [
        lambda t: t.replace(f"{BAR}DSML{BAR}", f"{BAR}{BAR}DSML{BAR}{BAR}", 1),
        lambda t: t.replace(f"<{BAR}DSML{BAR}{block}>", "< calls>", 1),
        lambda t: t.replace(f"{BAR}DSML{BAR}", "|DSML|"),
        lambda t: t.replace(f"{block}>", block.replace("_", "") + ">", 1),
        lambda t: re.sub(f'<{BAR}DSML{BAR}invoke name="[^"]*">\n', "", t, count=1),
        lambda t: t[: t.rfind("</")],
        lambda t: t.replace('name="', "name=\u201c", 1),
        lambda t: (
            t.replace('string="false">{', 'string="false">{{', 1)
            if '"false">{' in t
            else t.replace(f"</{BAR}DSML{BAR}invoke>", "", 1)
        ),
        lambda t: t + "\nDone.",
    ]
    return rng.choice(mutations)(text)


def json_concat(rng: random.Random) -> str:
    obj = json.dumps(_calls(rng, 1, same=True)[0], ensure_ascii=False)
    return obj * rng.randint(2, 3)


# ---------------------------------------------------------------------- driver
def generate(seeds: list[Example], seed: int, per_seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    g = Gen(seeds, rng)
    transforms = [
        g.script_salad,
        g.identifier_soup,
        g.fragment_soup,
        g.ascii_soup,
        g.stray_tokens,
        g.special_debris,
        g.fffd,
        g.sentence_loop,
        g.token_loop,
        g.drift_loop,
        g.line_cycle,
        g.char_run,
        g.special_loop,
    ]
    rows: list[dict[str, str]] = []
    for s in seeds:
        text = s["text"]
        for j in range(per_seed):
            fn = transforms[(hash_id(s["id"]) + j * 5 + seed) % len(transforms)]
            out, label = fn(text)
            row = {"id": f"gen{seed}-{s['id']}-{fn.__name__}-{j}", "text": out, "label": label}
            if "context" in s:
                row["context"] = s["context"]
            rows.append(row)
        r = rng.random()
        short = text[: g.cut(text, 0.2, 0.6)].rstrip()
        if r < 0.35 and _plain(s):
            rows.append(
                {
                    "id": f"gen{seed}-{s['id']}-tool-clean",
                    "label": "clean",
                    "text": clean_tool_turn(rng, short),
                }
            )
        elif r < 0.75 and _plain(s):
            rows.append(
                {
                    "id": f"gen{seed}-{s['id']}-tool-bad",
                    "label": "malformed_tool_call",
                    "text": malformed_tool_turn(rng, short),
                }
            )
        else:
            rows.append(
                {
                    "id": f"gen{seed}-{s['id']}-json-concat",
                    "label": "malformed_tool_call",
                    "text": json_concat(rng),
                }
            )
        plain = [x["text"] for x in seeds if x is not s and _plain(x)]
        if not _plain(s) or len(plain) < 2:
            continue
        others = rng.sample(plain, k=2)
        rows.append(
            {
                "id": f"gen{seed}-{s['id']}-long-clean",
                "label": "clean",
                "text": "\n\n".join([text, *others]),
            }
        )
    return rows


def _plain(s: Example) -> bool:
    """A seed that can be glued to others: no context it depends on, no tool-call markup."""
    return "context" not in s and BAR not in s["text"] and "<tool_call>" not in s["text"]


def hash_id(s: str) -> int:
    return sum(ord(c) * (i + 1) for i, c in enumerate(s))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seeds", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-seed", type=int, default=3)
    a = ap.parse_args(argv)
    seeds = [json.loads(x) for x in a.seeds.read_text(encoding="utf-8").splitlines() if x.strip()]
    seeds = [s for s in seeds if s.get("label") == "clean"]
    rows = generate(seeds, a.seed, a.per_seed)
    with a.out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
