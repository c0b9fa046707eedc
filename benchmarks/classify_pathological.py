"""The classifier on pathological answers: the shipped bounded verdict against the detector
run on the whole text, side by side in one process.

    python benchmarks/classify_pathological.py [--mb 1] [--repeats 3]

Each input is scored by ``classify_turn`` (texts past ``SCORE_MAX_CHARS`` scored on bounded
windows) and by ``score_text`` on the whole text (what ``classify_turn`` did before the
bound); the table gives the best of ``--repeats`` runs of each, in seconds, and the ratio.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from harness.verdict import classify_turn
from harness.verdict.detector.text import score_text


def inputs(size: int) -> dict[str, str]:
    prose = "The build passed and the tests ran in order, one file at a time. "
    table = "\n".join(f"line {i}: value {i * 7919 % 10007}" for i in range(size // 20))
    return {
        "one character (x)": "x" * size,
        "two-letter words": ("ab " * size)[:size],
        "one symbol (<)": "<" * size,
        "repeated sentence": (prose * (size // len(prose) + 1))[:size],
        "numbered lines": table[:size],
    }


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=float, default=1.0, help="size of each input in MB")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    size = int(args.mb * 1_000_000)
    print(f"{'input':<20} {'bounded s':>10} {'whole text s':>13} {'ratio':>7}  label")
    for name, text in inputs(size).items():
        bounded = best(lambda t=text: classify_turn(t), args.repeats)
        whole = best(lambda t=text: score_text(t), args.repeats)
        label = classify_turn(text).label
        print(f"{name:<20} {bounded:>10.3f} {whole:>13.3f} {whole / bounded:>7.1f}  {label}")


if __name__ == "__main__":
    main()
