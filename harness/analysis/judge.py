"""The judge's rule: is a judged turn's surprisal far above the model's own healthy outputs?

Each judged turn (judge.jsonl, written by run/judge.py) has ``judge_nll`` (the mean negative
log-likelihood per output token, teacher-forced, alone) and ``judge_nll_worst`` (the largest
mean over a window of ``WINDOW`` consecutive tokens: a corruption is local, a long healthy
answer would dilute it in the mean). The healthy reference is the turns of the same variant
the text detector passed and the judge sampled: their worst windows' median and MAD. A turn is
``judge_confirmed`` when its worst window is above

    max(ABS_FLOOR, median + MAD_FACTOR * 1.4826 * MAD)

-- far above what the same model shows on its own healthy outputs in the same run, and above
an absolute floor (so a run with very regular outputs does not confirm every small
variation). With fewer than ``MIN_REFERENCE`` sampled healthy turns only the floor applies.
Calibrated on the simulator's ground truth (docs/judge.md has the numbers).

**The greedy check.** A greedy request (temperature 0) gets, at every step, the token the
model ranks first; teacher-forced alone, a healthy greedy answer's every token is the model's
first choice again, up to the arithmetic's noise (a near tie flips, a fraction of a nat). A
token far below the model's first choice (``judge_gap``, nats: the first choice's logprob minus
the token's, the largest over the answer but its last token, which a length cut may have
re-tokenized) was not written by the model's greedy decode: something else put it there,
unless the model's first choice writes the same text (a word the model wrote in other pieces
than the tokenizer cuts it into now: " Er" + "chus" re-read as " Erch" + "us"), which the
runner checks by detokenizing before it counts a gap above the floor. For
greedy turns whose output renders as it was generated (content only: no tool calls re-rendered
by the template, no reasoning the template drops), the judge asks for the top-1 alternative and
a turn is also ``judge_confirmed`` when its gap is above ``GAP_FLOOR``. Repeated text is probable
to a model once it has started, so the window rule acquits loops; the greedy check sees the
token where the loop was spliced in. It is used for a variant only when its healthy sampled
turns agree: at least ``GAP_REFERENCE_MIN`` of them measured, and no evidence that more than
``GAP_REFERENCE_SHARE`` of them are above the floor (otherwise the server's rendering or
sampling does not reproduce its greedy decode, and the check is off, said in the variant's
``judge`` block). So the check's false confirmations of healthy suspects stay near that share
at most, under the 2% the tiers need.

``confirmed_session_corruption_rate``: sessions with at least one flagged turn the judge
confirmed, over the variant's sessions. ``judge_passed_confirmed``: the sampled passed turns
it confirmed (what the text detector misses, estimated).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.analysis import stats
from harness.record import safejson, turns
from harness.record.rundir import JUDGE_FILE, TURNS_FILE

WINDOW = 8
ABS_FLOOR = 2.0  # nats per token over the worst window
MAD_FACTOR = 8.0
MIN_REFERENCE = 5
#: the greedy check: a token this many nats below the model's first choice (e^3: 20 times
#: less likely) was not written by a greedy decode
GAP_FLOOR = 3.0
GAP_REFERENCE_MIN = 10
GAP_REFERENCE_SHARE = 0.02
KEY = ("variant", "repeat", "session", "turn", "attempt")


def window_nll(logprobs: Sequence[float], window: int = WINDOW) -> tuple[float, float]:
    """(mean NLL per token, the worst mean over ``window`` consecutive tokens)."""
    nll = [-x for x in logprobs]
    if not nll:
        return 0.0, 0.0
    mean = sum(nll) / len(nll)
    if len(nll) <= window:
        return mean, mean
    run = sum(nll[:window])
    worst = run
    for i in range(window, len(nll)):
        run += nll[i] - nll[i - window]
        worst = max(worst, run)
    return mean, worst / window


def greedy_gaps(
    logprobs: Sequence[float], top: Sequence[Mapping[int, float]]
) -> list[tuple[float, int, int]]:
    """(gap in nats, position, the model's first choice there) where the token given is not
    the model's first choice, over every token but the last, the largest gap first."""
    out = []
    for j, (lp, alts) in enumerate(zip(logprobs[:-1], top[:-1], strict=True)):
        if alts:
            first = max(alts, key=lambda k: alts[k])
            if alts[first] > lp:
                out.append((alts[first] - lp, j, first))
    return sorted(out, reverse=True)


def greedy_gap(logprobs: Sequence[float], top: Sequence[Mapping[int, float]]) -> float:
    """The largest gap, in nats, between the model's first choice and the token given, over
    every token but the last (0 for an answer of one token, or all first choices)."""
    gaps = greedy_gaps(logprobs, top)
    return gaps[0][0] if gaps else 0.0


def greedy_check(reference: Sequence[float]) -> bool:
    """Whether a variant's healthy sampled turns (their gaps) show that its greedy decode is
    reproduced by the judge's scoring, so that a gap above the floor means something: enough
    of them, and no evidence (the 95% Wilson interval's lower end) that more than
    ``GAP_REFERENCE_SHARE`` of them are above the floor. (A sampled turn above it is either
    one the rendering does not reproduce, or corruption the text detector missed.)"""
    over = sum(1 for g in reference if g > GAP_FLOOR)
    if len(reference) < GAP_REFERENCE_MIN:
        return False
    return stats.wilson(over, len(reference))[0] <= GAP_REFERENCE_SHARE


def _gaps(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    return [float(r["judge_gap"]) for r in rows
            if not r.get("flagged") and r.get("judge_gap") is not None]  # fmt: skip


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    return turns.read_rows(run_dir / JUDGE_FILE)


def threshold(reference: Sequence[float]) -> float:
    if len(reference) < MIN_REFERENCE:
        return ABS_FLOOR
    med = statistics.median(reference)
    mad = statistics.median(abs(x - med) for x in reference)
    return max(ABS_FLOOR, med + MAD_FACTOR * 1.4826 * mad)


def decide(rows: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each scored row with ``judge_confirmed`` (and ``judge_by``: ``window`` or ``greedy``,
    what confirmed it); the threshold per variant."""
    scored = [dict(r) for r in rows if r.get("judge_nll_worst") is not None]
    limits: dict[str, float] = {}
    greedy: dict[str, bool] = {}
    for label in {str(r.get("variant")) for r in scored}:
        mine = [r for r in scored if r.get("variant") == label]
        limits[label] = threshold([r["judge_nll_worst"] for r in mine if not r.get("flagged")])
        greedy[label] = greedy_check(_gaps(mine))
    for r in scored:
        label = str(r.get("variant"))
        by_window = r["judge_nll_worst"] > limits[label]
        gap = r.get("judge_gap")
        by_gap = greedy[label] and gap is not None and gap > GAP_FLOOR
        r["judge_confirmed"] = bool(by_window or by_gap)
        if r["judge_confirmed"]:
            r["judge_by"] = "window" if by_window else "greedy"
    return scored, limits


def variant_judge(rows: Sequence[Mapping[str, Any]], limit: float, sessions: int) -> dict[str, Any]:
    flagged = [r for r in rows if r.get("flagged")]
    passed = [r for r in rows if not r.get("flagged")]
    confirmed = [r for r in flagged if r["judge_confirmed"]]
    missed = [r for r in passed if r["judge_confirmed"]]
    conf_sessions = {(r.get("repeat"), r.get("session")) for r in confirmed}
    out: dict[str, Any] = {
        "judged": len(rows),
        "flagged_judged": len(flagged),
        "flagged_confirmed": len(confirmed),
        "passed_judged": len(passed),
        "passed_confirmed": len(missed),
        "passed_confirmed_ci": list(stats.wilson(len(missed), len(passed))),
        "threshold_nll": limit,
        "healthy_nll_median": statistics.median(r["judge_nll_worst"] for r in passed)
        if passed else None,
        "confirmed_sessions": len(conf_sessions),
        "confirmed_session_corruption_rate": len(conf_sessions) / sessions if sessions else None,
    }  # fmt: skip
    gaps = _gaps(rows)
    if gaps or any(r.get("judge_gap") is not None for r in flagged):
        out["greedy"] = {
            "on": greedy_check(gaps),
            "floor_nats": GAP_FLOOR,
            "reference": len(gaps),
            "reference_over": sum(1 for g in gaps if g > GAP_FLOOR),
            "flagged_checked": sum(1 for r in flagged if r.get("judge_gap") is not None),
            "flagged_confirmed": sum(1 for r in confirmed if r.get("judge_by") == "greedy"),
        }
    truth = [r for r in rows if r.get("sim_injected") is not None]
    if truth:
        bad = [r for r in truth if r["sim_injected"] != "none"]
        clean = [r for r in truth if r["sim_injected"] == "none"]
        yes = [r for r in truth if r["judge_confirmed"]]
        right = [r for r in yes if r["sim_injected"] != "none"]
        out["sim_precision"] = len(right) / len(yes) if yes else None
        out["sim_recall"] = len(right) / len(bad) if bad else None
        out["sim_false_positives"] = len(yes) - len(right)
        out["sim_clean_judged"] = len(clean)
        out["sim_false_positive_rate"] = (len(yes) - len(right)) / len(clean) if clean else None
    return out


def attach(summary: dict[str, Any], run_dir: Path) -> None:
    """Add ``judge`` and ``confirmed_session_corruption_rate`` to each judged variant."""
    scored, limits = decide(read_rows(run_dir))
    for v in summary.get("variants", []):
        mine = [r for r in scored if r.get("variant") == v["label"]]
        if not mine:
            continue
        block = variant_judge(mine, limits[v["label"]], int(v.get("sessions") or 0))
        v["judge"] = block
        v["confirmed_session_corruption_rate"] = block["confirmed_session_corruption_rate"]


def merge_into_turns(run_dir: Path) -> int:
    """Write ``judge_nll``, ``judge_nll_worst`` and ``judge_confirmed`` into the judged rows of
    turns.jsonl (the file replaced whole, atomically; call it with no writer open)."""
    scored, _ = decide(read_rows(run_dir))
    if not scored:
        return 0
    by_key = {tuple(r.get(k) for k in KEY): r for r in scored}
    path = run_dir / TURNS_FILE
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    # line by line: a run of 200,000 turns is not held in memory twice
    with open(path, "rb") as src, open(tmp, "wb") as out:
        for line in src:
            try:
                row = safejson.loads(line)
            except json.JSONDecodeError:
                out.write(line)
                continue
            hit = by_key.get(tuple(row.get(k) for k in KEY)) if isinstance(row, dict) else None
            if hit is None:
                out.write(line)
                continue
            row.update(judge_nll=round(hit["judge_nll"], 6), judge_nll_worst=round(
                hit["judge_nll_worst"], 6), judge_confirmed=hit["judge_confirmed"])  # fmt: skip
            for extra in ("judge_gap", "judge_by"):
                if hit.get(extra) is not None:
                    row[extra] = hit[extra]
            out.write(json.dumps(row).encode() + b"\n")  # (ASCII: any lone surrogate survives)
            n += 1
    os.replace(tmp, path)
    return n
