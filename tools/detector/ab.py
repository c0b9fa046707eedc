"""The detector of this checkout against the one of a git revision: findings and speed.

    python -m tools.detector.ab FILE.jsonl [FILE.jsonl ...] [--base REV] [--no-speed]

Loads ``harness/`` as it is at ``--base`` (default ``HEAD``: uncommitted changes against
the last commit) next to the working tree's, in the same process. Then:

* **findings**: ``score_text`` of both on every example (with its context and without),
  on the run-like mix and the long text of ``evaluate.py``, and on ``--slices``
  random substrings of them (any length, any cut); label, score, offset and signals must
  be identical. Exits 1 on any difference, listing the first ones.
* **parts** (``--parts``): the same, step by step (mask, tokens, each family of
  signals, windows) on the outputs of the run-like mix; with ``--fitted``, where the
  time of ``score_fitted`` goes on the turns (the rules, the features, the trees).
* **speed**: turns of 100-500 characters and the three workloads of ``evaluate.py``
  (``fallback_classify``, so the DSML parse is timed too, the same code on both sides),
  one pass of base then one of new, again and again until each side has ``--seconds`` of
  CPU time: MB/s and CPU microseconds per text per side, and the median ratio of
  neighbouring passes (a shared machine's load drifts slower than that).
  ``--fitted`` times this checkout's ``score_fitted`` (the fitted decision) as the new side,
  ``--base-rules`` the revision's ``rules`` (the hand-written detector alone) as the base.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from functools import partial
from io import BytesIO
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.verdict.detector import text as new_text
from tools.detector import evaluate as ev

ROOT = Path(__file__).resolve().parents[2]

Case = tuple[str, str, str | None]  # (name, text, context)


def load_base(rev: str, into: Path) -> ModuleType:
    """``harness.verdict.detector.text`` as it is at ``rev``, imported apart from the working tree's
    (its modules are taken out of ``sys.modules`` again; its functions keep their globals)."""
    tar = subprocess.run(
        ["git", "archive", rev, "harness"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as tf:
        tf.extractall(into, filter="data")
    saved = {k: v for k, v in sys.modules.items() if k == "harness" or k.startswith("harness.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(into))
    try:
        try:
            mod = importlib.import_module("harness.verdict.detector.text")
        except ModuleNotFoundError:  # a revision from before the detector's own subpackage
            mod = importlib.import_module("harness.verdict.text")
        if hasattr(mod, "model"):  # the fitted decision's model file: read it while it is there
            mod.model.load()
    finally:
        sys.path.remove(str(into))
        for k in [k for k in sys.modules if k == "harness" or k.startswith("harness.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return mod


def cases(rows: list[dict[str, Any]], slices: int, seed: int) -> list[Case]:
    out: list[Case] = []
    for r in rows:
        out.append((r["id"], r["text"], r.get("context")))
        if r.get("context"):
            out.append((r["id"] + "/no-context", r["text"], None))
    mix = ev.run_mix(rows)
    out.extend((f"mix-{i}", r["text"], None) for i, r in enumerate(mix))
    long_text = "\n\n".join(r["text"] for r in rows if r["label"] == "clean" and ev._plain(r))
    out.append(("long", long_text, None))
    rng = random.Random(seed)
    pool = [t for _, t, _ in out]
    for i in range(slices):
        t = rng.choice(pool)
        n = min(len(t), int(rng.expovariate(1 / 3000)) + 1)
        s = rng.randint(0, len(t) - n)
        out.append((f"slice-{i}", t[s : s + n], None))
    return out


def compare(base: ModuleType, cs: list[Case]) -> list[str]:
    diffs = []
    for name, t, c in cs:
        a, b = base.score_text(t, c), new_text.score_text(t, c)
        got_a = (a.label, a.score, a.offset, a.signals)
        got_b = (b.label, b.score, b.offset, b.signals)
        if got_a != got_b:
            diffs.append(f"{name}: base {got_a} new {got_b}")
    return diffs


def _pass(classify: Callable[[str, str | None], str], texts: list[tuple[str, str | None]]) -> float:
    t0 = time.process_time()
    for t, c in texts:
        classify(t, c)
    return time.process_time() - t0


def turns(rows: list[dict[str, Any]], n: int = 400, seed: int = 0) -> list[tuple[str, None]]:
    """Turn-sized texts: ``n`` pieces of 100-500 characters of the examples (a whole example
    when it is that long, else a piece of a longer one cut at a space). Deterministic."""
    rng = random.Random(seed)
    texts = [r["text"] for r in rows if len(r["text"]) >= 100]
    out: list[tuple[str, None]] = []
    while texts and len(out) < n:
        t = rng.choice(texts)
        size = rng.randint(100, 500)
        if len(t) > size:
            s = rng.randint(0, len(t) - size)
            s = t.rfind(" ", 0, s) + 1
            t = t[s : s + size]
        out.append((t, None))
    return out


def speed(
    base: ModuleType,
    rows: list[dict[str, Any]],
    seconds: float,
    fitted: bool = False,
    base_rules: bool = False,
) -> None:
    """Per workload: passes over the texts, base and new in turn, until each side has
    ``seconds`` of CPU time; MB/s per side and the median ratio of neighbouring passes."""
    long_text = "\n\n".join(r["text"] for r in rows if r["label"] == "clean" and ev._plain(r))
    loads = {
        "turns of 100-500 chars": turns(rows),
        "run-like mix": [(r["text"], r.get("context")) for r in ev.run_mix(rows)],
        "examples one by one": [(r["text"], r.get("context")) for r in rows],
        f"one {len(long_text) // 1000} k text": [(long_text, None)],
    }
    base_f = partial(ev.fallback_classify, score_text=base.rules if base_rules else base.score_text)
    new_score = new_text.score_fitted if fitted else new_text.score_text
    new_f = partial(ev.fallback_classify, score_text=new_score)
    for name, texts in loads.items():
        size = sum(len(t.encode("utf-8")) for t, _ in texts)
        for f in (base_f, new_f):
            for t, c in texts[:50]:  # warm-up (lazy tables, regex caches)
                f(t, c)
        # each pass at least 50 ms: repeat short workloads
        reps = max(1, int(0.05 / max(_pass(new_f, texts), 1e-6)))
        batch = texts * reps
        tb: list[float] = []
        tn: list[float] = []
        while sum(tb) < seconds or sum(tn) < seconds:
            tb.append(_pass(base_f, batch))
            tn.append(_pass(new_f, batch))
        mb = size * reps / 1e6
        ratio = statistics.median(b / n for b, n in zip(tb, tn, strict=True))
        per = 1e6 / (len(batch))
        print(
            f"{name:22s} base {mb * len(tb) / sum(tb):5.2f} MB/s {per * sum(tb) / len(tb):8.0f} us"
            f"   new {mb * len(tn) / sum(tn):5.2f} MB/s {per * sum(tn) / len(tn):8.0f} us"
            f"   new/base speed {ratio:.2f} (median of {len(tb)} pass pairs)"
        )


def _stages(t: ModuleType, texts: list[str]) -> dict[str, Callable[[], object]]:
    """The full path of ``t.score_text`` cut into its steps, each over all ``texts``
    (inputs of a step prepared by the steps before it)."""
    repeat, salad, chars = t.repeat, t.salad, t.Chars
    works = [t._unescape(x) for x in texts]
    ms = [t.mask(w) for w in works]
    lc = [chars(m.loops) for m in ms]
    pc = [c if m.prose is m.loops else chars(m.prose) for c, m in zip(lc, ms, strict=True)]
    tk = [repeat.tokenize(m.loops, c) for m, c in zip(ms, lc, strict=True)]
    evs = [
        t._events(p, k, None, m, t._special(w))
        for p, k, m, w in zip(pc, tk, ms, works, strict=True)
    ]
    return {
        "score_text (all)": lambda: [t.score_text(w) for w in works],
        "mask": lambda: [t.mask(w) for w in works],
        "byte views": lambda: [
            (chars(m.loops).cls("punct"), m.prose is m.loops or chars(m.prose).cls("punct"))
            for m in ms
        ],
        "tokens": lambda: [repeat.tokenize(m.loops, c) for m, c in zip(ms, lc, strict=True)],
        "special tokens": lambda: [t._special(w) for w in works],
        "salad signals": lambda: [salad.primary_events(p, fffd=False) for p in pc],
        "scripts": lambda: [p.ascii or t._scripts(p, []) for p in pc],
        "glued words": lambda: [repeat.glued(k) for k in tk],
        "periodic words": lambda: [repeat.periodic(k) for k in tk],
        "loops": lambda: [t._loops(k, None, m.code, []) for k, m in zip(tk, ms, strict=True)],
        "stutters": lambda: [
            t._stutters(p, k, m, list(e)) for p, k, m, e in zip(pc, tk, ms, evs, strict=True)
        ],
        "windows": lambda: [t._combine(list(e)) for e in evs if e],
    }


def parts(base: ModuleType, rows: list[dict[str, Any]], rounds: int = 6) -> None:
    """Where the time of one output of the run-like mix goes, step by step, base and new
    timed in turn (CPU microseconds per output; the steps do not add up to the whole:
    event lists, code weights and tool-call values are left out)."""
    texts = [r["text"] for r in ev.run_mix(rows)]
    sides = (_stages(base, texts), _stages(new_text, texts))
    got = {k: [0.0, 0.0] for k in sides[0]}
    for _ in range(rounds):
        for k in got:
            for i, stages in enumerate(sides):
                t0 = time.process_time()
                stages[k]()
                got[k][i] += time.process_time() - t0
    print(f"per output of the mix ({sum(map(len, texts)) // len(texts)} characters on average):")
    for k, (b, n) in got.items():
        us = 1e6 / rounds / len(texts)
        print(f"  {k:18s} base {b * us:7.0f} us   new {n * us:7.0f} us   base/new {b / n:5.2f}")


def fitted_parts(rows: list[dict[str, Any]], rounds: int = 5) -> None:
    """Where the time of this checkout's ``score_fitted`` goes on the turns of 100-500
    characters: the rules, the features, the trees, each timed per text in the order the
    decision runs them (so each step meets the caches the step before it left)."""
    from harness.verdict.detector.fitted import features, model

    fitted = model.load()
    texts = [new_text._unescape(t) for t, _ in turns(rows)]
    got = [0.0, 0.0, 0.0]
    clock = time.process_time
    for _ in range(rounds):
        for w in texts:
            t0 = clock()
            found = new_text.rules(w, None, unescaped=True)
            t1 = clock()
            x, _ = features.vector(
                w, found.score, found.signals, fitted.chars, fitted.words, fitted.weights
            )
            t2 = clock()
            fitted.p_corrupted(x)
            t3 = clock()
            got[0] += t1 - t0
            got[1] += t2 - t1
            got[2] += t3 - t2
    us = 1e6 / rounds / len(texts)
    print(
        f"score_fitted per turn of 100-500 characters: rules {got[0] * us:.0f} us, "
        f"features {got[1] * us:.0f} us, trees {got[2] * us:.0f} us (CPU time)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="This checkout's detector against a revision's.")
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--base", default="HEAD", help="git revision to compare with (HEAD)")
    ap.add_argument("--slices", type=int, default=2000, help="random substrings compared")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=3.0, help="CPU time per side")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--no-findings", action="store_true")
    ap.add_argument("--parts", action="store_true", help="time each step on the mix")
    ap.add_argument(
        "--fitted", action="store_true", help="time this checkout's score_fitted as the new side"
    )
    ap.add_argument(
        "--base-rules", action="store_true", help="time the revision's rules as the base side"
    )
    a = ap.parse_args(argv)
    rows = ev.load(a.files)
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(a.base, Path(tmp))
    rc = 0
    if not a.no_findings:
        cs = cases(rows, a.slices, a.seed)
        diffs = compare(base, cs)
        print(f"findings: {len(cs)} texts compared, {len(diffs)} differ (base {a.base})")
        for d in diffs[:20]:
            print("  " + d)
        rc = 1 if diffs else 0
    if not a.no_speed:
        speed(base, rows, a.seconds, a.fitted, a.base_rules)
    if a.parts:
        if a.fitted:
            fitted_parts(rows)
        else:
            parts(base, rows)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
