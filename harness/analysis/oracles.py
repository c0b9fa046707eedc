"""What the exact oracles found: replay alone, passkeys, the server's own alarms.

Each oracle writes one row per checked send to its own file of the run folder (record.rundir:
``oracle_replay.jsonl``, ``oracle_passkey.jsonl``, ``oracle_alarms.jsonl``), keyed like
confirm.jsonl by ``(variant, repeat, session, turn, attempt)``. ``oracle_evidence`` gives, for
each send some exact oracle says is wrong, the names of those oracles (the ``confirmed`` tier
of the verdict folds it in); ``attach`` adds ``oracles`` to each variant of a summary, and the
flat numbers the gates read (``replay_divergence_rate``, ``passkey_wrong_rate``, ...).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from harness.analysis import stats
from harness.analysis.confirm import row_key
from harness.record.rundir import (
    ORACLE_ALARMS_FILE,
    ORACLE_PASSKEY_ALONE_FILE,
    ORACLE_PASSKEY_FILE,
    ORACLE_REPLAY_FILE,
    TURNS_FILE,
)
from harness.record.turns import read_rows

Key = tuple[Any, ...]

#: oracle name -> (its file, the row statuses that say "this send is wrong")
WRONG: dict[str, tuple[str, frozenset[str]]] = {
    "replay": (ORACLE_REPLAY_FILE, frozenset({"diverged"})),
    "passkey": (ORACLE_PASSKEY_FILE, frozenset({"wrong", "missing"})),
    "spec_accept": (ORACLE_ALARMS_FILE, frozenset({"spec_accept"})),
    "kv_canary": (ORACLE_ALARMS_FILE, frozenset({"kv_canary"})),
}


def _rows(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return read_rows(run_dir / name)


def oracle_evidence(run_dir: Path | str) -> dict[Key, list[str]]:
    """For each send some exact oracle says is wrong, the names of those oracles.

    Keys are ``(variant, repeat, session, turn, attempt)`` as in turns.jsonl. ``replay``
    counts only on a server that declared a deterministic mode (``exact``); an alarm row
    names its oracle in ``alarm``.
    """
    run_dir = Path(run_dir)
    out: dict[Key, list[str]] = {}
    cache: dict[str, list[dict[str, Any]]] = {}
    for name, (file, wrong) in WRONG.items():
        rows = cache.setdefault(file, _rows(run_dir, file))
        for r in rows:
            if name == "replay" and not r.get("exact"):
                continue
            status = r.get("alarm") if file == ORACLE_ALARMS_FILE else r.get("status")
            if status in wrong:
                names = out.setdefault(row_key(r), [])
                if name not in names:
                    names.append(name)
    return out


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = stats.wilson(k, n) if n else (0.0, 1.0)
    return {"rate": k / n if n else None, "ci": [lo, hi]}


def _loaded_sends(turns: list[dict[str, Any]], variant: str) -> int:
    return sum(1 for t in turns if t.get("variant") == variant)


def replay_summary(rows: list[dict[str, Any]], loaded_sends: int) -> dict[str, Any]:
    """Per variant: sends replayed alone, identical, diverged, undecided, the divergence rate
    with its interval, how they were compared (tokens or text), the judge's verdicts on the
    diverged sends' loaded continuations, the cost, and a few examples."""
    done = [r for r in rows if r.get("status") in ("identical", "diverged")]
    diverged = [r for r in done if r["status"] == "diverged"]
    rate = _rate(len(diverged), len(done))
    compared = Counter(str(r.get("compared", "text")) for r in done)
    judged = [r for r in diverged if r.get("judge_verdict")]
    implausible = sum(1 for r in judged if r["judge_verdict"] == "implausible")
    again = sum(1 for r in rows if "concurrent_diverged" in r)
    return {
        "exact": all(bool(r.get("exact")) for r in rows),
        "exact_reason": rows[0].get("exact_reason") if rows else None,
        "compared": compared.most_common(1)[0][0] if compared else "text",
        "compared_by": dict(sorted(compared.items())),
        "replayed": len(rows),
        "identical": len(done) - len(diverged),
        "diverged": len(diverged),
        "undecided": len(rows) - len(done),
        "divergence_rate": rate["rate"],
        "divergence_ci": rate["ci"],
        "judge": {
            "judged": len(judged),
            "implausible": implausible,
            "plausible": len(judged) - implausible,
            "not_judged": len(diverged) - len(judged),
            "error": next((r["judge_error"] for r in diverged if r.get("judge_error")), None),
        },
        # (--oracle-concurrency: a send that differed beside the others, or that was flagged
        # under load, is re-sent once more alone)
        "extra_requests": len(rows) + again,
        "rechecked_alone": again,
        "load_share": (len(rows) + again) / loaded_sends if loaded_sends else None,
        "examples": [
            {
                k: r.get(k)
                for k in (
                    "session",
                    "turn",
                    "attempt",
                    "compared",
                    "position",
                    "token_index",
                    "loaded_text",
                    "alone_text",
                    "loaded_tokens",
                    "alone_tokens",
                    "loaded_label",
                    "judge_verdict",
                    "judge_nll_worst",
                    "judge_threshold",
                )
            }  # fmt: skip
            for r in diverged[:3]
        ],
    }


#: upper bounds (tokens between the plant and the ask) of the recall-by-distance buckets
DISTANCE_BUCKETS = (1_000, 4_000, 16_000, 64_000, 256_000)


def _counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    decided = [r for r in rows if r.get("status") in ("right", "wrong", "missing")]
    bad = sum(1 for r in decided if r["status"] != "right")
    rate = _rate(bad, len(decided))
    return {
        "checked": len(decided),
        "right": len(decided) - bad,
        "wrong": sum(1 for r in decided if r["status"] == "wrong"),
        "missing": sum(1 for r in decided if r["status"] == "missing"),
        "undecided": sum(1 for r in rows if r.get("status") == "undecided"),
        "not_asked": sum(1 for r in rows if r.get("status") == "not_asked"),
        "wrong_rate": rate["rate"],
        "wrong_ci": rate["ci"],
    }


def by_distance(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recall by how many tokens back the passkey was planted (the plot reads it)."""
    out = []
    lo = 0
    for hi in DISTANCE_BUCKETS:
        inside = [r for r in rows if r.get("distance_tokens") is not None
                  and lo <= r["distance_tokens"] < hi]  # fmt: skip
        if inside:
            c = _counts(inside)
            recall = 1 - c["wrong_rate"] if c["wrong_rate"] is not None else None
            out.append({"from_tokens": lo, "to_tokens": hi, "checked": c["checked"],
                        "recall": recall})  # fmt: skip
        lo = hi
    return out


def passkey_summary(
    loaded: list[dict[str, Any]], alone: list[dict[str, Any]], loaded_sends: int
) -> dict[str, Any]:
    """Loaded and alone recall failure, their difference (the verdict: the model's own
    failure rate is the false-alarm floor), by distance, and the cost."""
    a, b = _counts(loaded), _counts(alone)
    ka, na = a["checked"] - a["right"], a["checked"]
    kb, nb = b["checked"] - b["right"], b["checked"]
    d, lo, hi = stats.diff_ci(ka, na, kb, nb)
    p = stats.fisher_exact(ka, na, kb, nb, alternative="greater") if na and nb else None
    return {
        "loaded": a,
        "alone": b,
        "excess_wrong_rate": d if na and nb else None,
        "excess_ci": [lo, hi],
        "p_value": p,
        "worse_under_load": bool(p is not None and p < 0.05),
        "by_distance": by_distance(loaded),
        "extra_requests": len(alone),
        "load_share": len(alone) / loaded_sends if loaded_sends else None,
    }


def alarms_summary(rows: list[dict[str, Any]], loaded_sends: int) -> dict[str, Any]:
    """The server's alarms of one variant: speculative acceptance (sends checked, alarms by
    reason, rate) and KV canary lines (lines, sends in flight tied to them)."""
    spec = [r for r in rows if r.get("alarm") in ("spec_accept", None) and "accept_length" in r]
    hit = [r for r in spec if r.get("alarm") == "spec_accept"]
    rate = _rate(len(hit), len(spec))
    lines = [r for r in rows if r.get("alarm") == "kv_canary_line"]
    tied = {row_key(r) for r in rows if r.get("alarm") == "kv_canary"}
    return {
        "spec_accept": {
            "checked": len(spec), "alarms": len(hit),
            "accept_length": sum(1 for r in hit if r.get("reason") == "accept_length"),
            "accept_rate": sum(1 for r in hit if r.get("reason") == "accept_rate"),
            "rate": rate["rate"], "ci": rate["ci"],
        },
        "kv_canary": {"count": len(lines), "sends": len(tied),
                      "share": len(tied) / loaded_sends if loaded_sends else None},
        "extra_requests": 0,  # read from the answers and the log: no request of their own
        "load_share": 0.0,
    }  # fmt: skip


def _of(rows: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("variant") == variant]


def attach(summary: dict[str, Any], run_dir: Path) -> None:
    """Add ``oracles`` (and the flat gate metrics) to each variant that has oracle rows."""
    replay = _rows(run_dir, ORACLE_REPLAY_FILE)
    passkey = _rows(run_dir, ORACLE_PASSKEY_FILE)
    alone = _rows(run_dir, ORACLE_PASSKEY_ALONE_FILE)
    alarms = _rows(run_dir, ORACLE_ALARMS_FILE)
    if not (replay or passkey or alarms):
        return
    turns = _rows(run_dir, TURNS_FILE)
    for v in summary.get("variants", []):
        label = v["label"]
        sends = _loaded_sends(turns, label)
        found: dict[str, Any] = {}
        if rows := _of(replay, label):
            r = found["replay"] = replay_summary(rows, sends)
            v["replay_divergence_rate"] = r["divergence_rate"]
            v["replay_diverged_turns"] = r["diverged"]
            v["replay_implausible_turns"] = r["judge"]["implausible"]
        if rows := _of(passkey, label):
            p = found["passkey"] = passkey_summary(rows, _of(alone, label), sends)
            v["passkey_wrong_rate"] = p["loaded"]["wrong_rate"]
            v["passkey_alone_wrong_rate"] = p["alone"]["wrong_rate"]
            v["passkey_excess_wrong_rate"] = p["excess_wrong_rate"]
        if rows := _of(alarms, label):
            a = found["alarms"] = alarms_summary(rows, sends)
            v["spec_accept_alarm_rate"] = a["spec_accept"]["rate"]
            v["spec_accept_alarms"] = a["spec_accept"]["alarms"]
            v["kv_canary_alarms"] = a["kv_canary"]["count"]
        if found:
            v["oracles"] = found


#: The flat per-variant numbers a gate can read (gates.KNOWN_METRICS adds them).
ORACLE_METRICS = (
    "replay_divergence_rate", "replay_diverged_turns", "replay_implausible_turns",
    "passkey_wrong_rate",
    "passkey_alone_wrong_rate", "spec_accept_alarms",
    "passkey_excess_wrong_rate", "spec_accept_alarm_rate", "kv_canary_alarms",
)  # fmt: skip
