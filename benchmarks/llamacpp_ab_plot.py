"""Draw the llama.cpp A/B (KV cache type x slots) from the results JSON.

    python benchmarks/llamacpp_ab_plot.py docs/img/llamacpp_ab.json docs/img/llamacpp_ab.png

The JSON is what benchmarks/llamacpp_ab.py writes (summary.json / comparison.json), merged
under {"reference": NAME, "configs": {NAME: summary}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = ("ok_text", "truncated", "repetition")


def _fraction(text: str | None) -> float | None:
    if not text:
        return None
    a, b = text.split("/")
    return int(a) / int(b) if int(b) else None


def main(src: Path, dst: Path) -> None:
    doc = json.loads(src.read_text())
    ref = doc["reference"]
    names = [ref] + [n for n in doc["configs"] if n != ref]
    configs = doc["configs"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.45 * len(names) + 1.8), sharey=True)
    y = range(len(names))
    same = []
    for n in names:
        vs = configs[n].get("vs_baseline") or {}
        f = _fraction((vs.get("per_turn_same") or {}).get("0"))
        same.append(1.0 if n == ref else (f or 0.0))
    ax1.barh(list(y), [100 * s for s in same], color="#4c72b0")
    for i, s in zip(y, same, strict=True):
        ax1.text(
            100 * s + 1,
            i,
            "reference" if names[i] == ref else f"{100 * s:.0f}%",
            va="center",
            fontsize=8,
        )
    ax1.set_xlim(0, 115)
    ax1.set_xlabel(f"turn-0 answers identical to {ref} (% of 8 sessions)")
    ax1.set_title("Same prompt, same text? (temperature 0)")
    left = [0.0] * len(names)
    colors = {"ok_text": "#55a868", "truncated": "#dd8452", "repetition": "#c44e52"}
    for label in LABELS:
        vals = []
        for n in names:
            labels = configs[n]["labels"]
            total = sum(labels.values()) or 1
            vals.append(100 * labels.get(label, 0) / total)
        ax2.barh(list(y), vals, left=left, color=colors[label], label=label)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax2.set_xlabel("labels of first sends (% of turns)")
    ax2.set_title("What the harness judged")
    ax2.legend(loc="lower right", fontsize=8)
    ax1.set_yticks(list(y), names)
    ax1.invert_yaxis()
    fig.suptitle("llama.cpp (xllamacpp, SmolLM2-135M, CPU): KV cache type x parallel slots")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
