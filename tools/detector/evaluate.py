"""Measure the text classifier on labelled JSONL files: quality per class and speed.

    python -m tools.detector.evaluate FILE.jsonl [FILE.jsonl ...] [--errors] [--no-speed]

Each line is ``{"id", "text", "label", "context"?}`` with label one of ``salad``,
``repetition``, ``malformed_tool_call``, ``clean``, ``ambiguous``. Prints precision, recall
and false-positive rate (share of clean examples given that class) per class, the same for
"garbled" (the three corrupted classes together) against clean, how the ambiguous examples
were labelled, and the speed in MB/s of text classified per second on one core (the texts
are classified again and again for half a second of CPU time or more), on three
workloads: a run-like mix of long outputs, the examples one by one, and one long text.

The classifier is ``harness.verdict.classify_text`` when the package has it; otherwise a
small wrapper: the DSML parser's verdict for tool-call markup, then ``score_text``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.dialects import dsml
from harness.verdict.detector import text as text_mod

CLASSES = ("salad", "repetition", "malformed_tool_call")
_TO_CLASS = {
    "token_salad": "salad",
    "repetition": "repetition",
    "malformed_tool_call": "malformed_tool_call",
    "invalid_tool_call": "malformed_tool_call",
}
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_XML_CALL = re.compile(r"</?(?:invoke|parameter|function|tool_calls|function_calls)\b[^>]*>")


def fallback_classify(
    text: str,
    context: str | None = None,
    score_text: Callable[[str, str | None], Any] = text_mod.score_text,
) -> str:
    """DSML parse errors and broken JSON envelopes first, then salad / repetition
    (``score_text``: this checkout's by default; ab.py passes another one)."""
    pr = dsml.parse(text)
    if pr.found and not pr.ok:
        return "malformed_tool_call"
    if not pr.found and _XML_CALL.search(text):
        return "malformed_tool_call"
    for m in _HERMES.finditer(text):
        if not _json_ok(m.group(1)):
            return "malformed_tool_call"
    s = text.strip()
    if s[:1] == "{" and s[-1:] == "}" and not _json_ok(s):
        return "malformed_tool_call"
    f = score_text(pr.content if pr.found and pr.ok else text, context)
    return f.label or "ok_text"


def _json_ok(s: str) -> bool:
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


def pick_classifier(which: str = "auto") -> tuple[str, Callable[[str, str | None], str]]:
    import harness.verdict as verdict

    ct = getattr(verdict, "classify_text", None)
    if ct is None or which == "fallback":
        return "fallback (dsml.parse + score_text)", fallback_classify

    def run(text: str, context: str | None) -> str:
        return str(ct(text, context=context).label)

    return "harness.verdict.classify_text", run


def load(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        for line in p.read_text(encoding="utf-8").split("\n"):  # (not splitlines: U+2028)
            if line.strip():
                rows.append(json.loads(line))
    return rows


def evaluate(
    rows: list[dict[str, Any]], classify: Callable[[str, str | None], str]
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Per-class and garbled metrics; also the misclassified (id, truth, predicted)."""
    pairs = []
    for r in rows:
        pred = _TO_CLASS.get(classify(r["text"], r.get("context")), "clean")
        pairs.append((r["id"], r["label"], pred))
    scored = [(t, p) for _, t, p in pairs if t != "ambiguous"]
    n_clean = sum(1 for t, _ in scored if t == "clean")
    out: dict[str, Any] = {"n": len(rows), "clean": n_clean, "classes": {}}
    for c in CLASSES:
        tp = sum(1 for t, p in scored if t == c and p == c)
        n_true = sum(1 for t, _ in scored if t == c)
        n_pred = sum(1 for _, p in scored if p == c)
        fp_clean = sum(1 for t, p in scored if t == "clean" and p == c)
        out["classes"][c] = _metrics(tp, n_true, n_pred, fp_clean, n_clean)
    garbled = set(CLASSES)
    tp = sum(1 for t, p in scored if t in garbled and p in garbled)
    n_true = sum(1 for t, _ in scored if t in garbled)
    n_pred = sum(1 for _, p in scored if p in garbled)
    fp_clean = sum(1 for t, p in scored if t == "clean" and p in garbled)
    out["garbled"] = _metrics(tp, n_true, n_pred, fp_clean, n_clean)
    out["ambiguous"] = dict(Counter(p for _, t, p in pairs if t == "ambiguous"))
    errors = [
        (i, t, p) for i, t, p in pairs if t != "ambiguous" and (t in garbled) != (p in garbled)
    ]
    return out, errors


def _metrics(tp: int, n_true: int, n_pred: int, fp_clean: int, n_clean: int) -> dict[str, Any]:
    return {
        "n": n_true,
        "precision": tp / n_pred if n_pred else None,
        "recall": tp / n_true if n_true else None,
        "fpr": fp_clean / n_clean if n_clean else None,
    }


def speed(rows: list[dict[str, Any]], classify: Callable[[str, str | None], str]) -> float:
    """MB of text classified per second of CPU time (one core), over the rows repeated for
    0.5 s or more. CPU time, not wall time: a shared machine's other jobs do not count."""
    texts = [(r["text"], r.get("context")) for r in rows]
    size = sum(len(t.encode("utf-8")) for t, _ in texts)
    for t, c in texts[:50]:  # warm-up (lazy tables, regex caches)
        classify(t, c)
    done, t0 = 0, time.process_time()
    while True:
        for t, c in texts:
            classify(t, c)
        done += size
        elapsed = time.process_time() - t0
        if elapsed >= 0.5:
            return done / elapsed / 1e6


def _plain(r: dict[str, Any]) -> bool:
    return "\uff5c" not in r["text"] and "<tool_call>" not in r["text"] and "context" not in r


def run_mix(rows: list[dict[str, Any]], n: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    """What a run sees: mostly clean long outputs (2k-24k characters, glued from distinct clean
    examples: an example glued twice would make the output a loop), one in ten a corrupted
    example. Deterministic."""
    rng = random.Random(seed)
    clean = [r["text"] for r in rows if r["label"] == "clean" and _plain(r)]
    bad = [r for r in rows if r["label"] in ("salad", "repetition")]
    out: list[dict[str, Any]] = []
    if not clean:
        return out
    for i in range(n):
        if bad and i % 10 == 9:
            out.append(rng.choice(bad))
            continue
        target, parts, size = rng.randint(2000, 24000), [], 0
        for text in rng.sample(clean, len(clean)):
            if size >= target:
                break
            parts.append(text)
            size += len(text) + 2
        out.append({"text": "\n\n".join(parts), "label": "clean"})
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials (95 %)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _rate(k: int, n: int) -> str:
    if not n:
        return "-"
    lo, hi = wilson(k, n)
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}] ({k}/{n})"


def by_source(
    rows: list[dict[str, Any]],
    classify: Callable[[str, str | None], str],
    key: str = "source",
    preds: list[str] | None = None,
) -> tuple[list[str], list[tuple[str, ...]]]:
    """Markdown table rows: per ``key`` value, clean FPR and recall per class (Wilson 95 %).
    ``preds``: the classes already predicted for ``rows`` (one pass for several keys)."""
    if preds is None:
        preds = predict(rows, classify)
    groups: dict[str, list[tuple[str, str]]] = {}
    for r, pred in zip(rows, preds, strict=True):
        if r["label"] == "ambiguous":
            continue
        groups.setdefault(str(r.get(key, "?")), []).append((r["label"], pred))
        groups.setdefault("all", []).append((r["label"], pred))
    out: list[tuple[str, ...]] = []
    for name in [*sorted(g for g in groups if g != "all"), "all"]:
        pairs = groups[name]
        clean = [p for t, p in pairs if t == "clean"]
        bad = [(t, p) for t, p in pairs if t != "clean"]
        cols = [
            name,
            _rate(sum(p != "clean" for p in clean), len(clean)),
            _rate(sum(p != "clean" for _, p in bad), len(bad)),
        ]
        for c in ("salad", "repetition"):
            sel = [p for t, p in bad if t == c]
            cols.append(_rate(sum(p != "clean" for p in sel), len(sel)))
        out.append(tuple(cols))
    header = [
        key,
        "clean FPR [95 % CI]",
        "garbled recall [95 % CI]",
        "salad recall",
        "repetition recall",
    ]
    return header, out


def predict(rows: list[dict[str, Any]], classify: Callable[[str, str | None], str]) -> list[str]:
    """The class predicted for every row (clean when it is none of ``CLASSES``)."""
    return [_TO_CLASS.get(classify(r["text"], r.get("context")), "clean") for r in rows]


def print_markdown(header: list[str], table: Sequence[tuple[str, ...]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in table:
        print("| " + " | ".join(r) + " |")


def _fmt(v: float | None) -> str:
    return "   -  " if v is None else f"{v:6.3f}"


def report(name: str, m: dict[str, Any]) -> None:
    print(f"\n{name}: {m['n']} examples ({m['clean']} clean)")
    print(f"  {'class':22s} {'n':>4s} {'prec':>6s} {'recall':>6s} {'FPR':>6s}")
    for c, v in [*m["classes"].items(), ("garbled (all three)", m["garbled"])]:
        print(f"  {c:22s} {v['n']:4d} {_fmt(v['precision'])} {_fmt(v['recall'])} {_fmt(v['fpr'])}")
    if m["ambiguous"]:
        print(f"  ambiguous (not scored): {m['ambiguous']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Evaluate the salad/repetition classifier.")
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--errors", action="store_true", help="list misclassified examples")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument(
        "--no-context",
        action="store_true",
        help="ignore the context field (for sets where it describes the source, not the prompt)",
    )
    ap.add_argument(
        "--classifier",
        choices=("auto", "fallback"),
        default="auto",
        help="auto: harness.verdict.classify_text when present; fallback: the wrapper here",
    )
    ap.add_argument(
        "--by",
        help="a Markdown table with one row per value of this field (corpus files: source, "
        "group, kind, label; several, comma-separated, from one pass), Wilson 95 %% intervals",
    )
    ap.add_argument("--split", help="only rows whose split field is this (corpus files)")
    ap.add_argument(
        "--detector",
        choices=("default", "rules", "fitted"),
        default="default",
        help="the text detector of the fallback classifier: score_text (default: what a run "
        "uses), text.rules (the hand-written rules) or score_fitted (the fitted decision)",
    )
    a = ap.parse_args(argv)
    name, classify = pick_classifier(a.classifier)
    if a.detector != "default":
        if a.classifier != "fallback":
            ap.error(f"--detector {a.detector} needs --classifier fallback")
        detector = text_mod.rules if a.detector == "rules" else text_mod.score_fitted
        name = f"fallback (dsml.parse + {detector.__name__})"

        def classify(text: str, context: str | None) -> str:
            return fallback_classify(text, context, detector)

    if a.no_context:
        inner = classify

        def classify(text: str, context: str | None) -> str:
            return inner(text, None)

    print(f"classifier: {name}; THRESHOLD = {text_mod.THRESHOLD}")
    if a.by:
        rows = []
        for p in a.files:
            for r in load([p]):
                if a.split is None or r.get("split") == a.split:
                    r.setdefault("source", p.stem)
                    r.setdefault("kind", r["label"])
                    rows.append(r)
        preds = predict(rows, classify)
        for key in a.by.split(","):
            header, table = by_source(rows, classify, key, preds)
            print()
            print_markdown(header, table)
        return 0
    all_rows = []
    for p in a.files:
        rows = load([p])
        all_rows.extend(rows)
        m, errors = evaluate(rows, classify)
        report(str(p.name), m)
        if a.errors:
            for i, t, pr in errors:
                print(f"    miss: {i}  truth={t}  predicted={pr}")
    if len(a.files) > 1:
        m, _ = evaluate(all_rows, classify)
        report("all files", m)
    if not a.no_speed:
        mix = run_mix(all_rows)
        mix_mbs = speed(mix, classify)
        mbs = speed(all_rows, classify)
        long_text = "\n\n".join(r["text"] for r in all_rows if r["label"] == "clean" and _plain(r))
        long_mbs = speed([{"text": long_text}], classify)
        mix_kb = sum(len(r["text"]) for r in mix) / len(mix) / 1000 if mix else 0.0
        print(
            f"\nspeed (MB/s of CPU time, one core): {mix_mbs:.1f} on a run-like mix "
            f"({len(mix)} outputs, {mix_kb:.0f} k characters on average, one in ten "
            f"corrupted); {mbs:.1f} over the examples one by one; {long_mbs:.1f} on one "
            f"{len(long_text) // 1000} k-character text of every clean example"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
