"""``--until-significant``: stop adding rounds of sessions once every comparison is decided.

The model is the planner's (``stats.turns_needed``, ``harness run --dry-run --detect``): the
turn corruption rates of two variants, turns clustered in sessions, compared by a two-sided
test whose sample is the turns over their design effect (``stats.clustered_fisher``; the
design effect the planner assumes is here measured from each variant's sessions)."""

from __future__ import annotations

from pathlib import Path

from harness.record.turns import iter_turns


def decision(
    turns_path: Path, labels: list[str], *, look: int, looks: int, alpha: float
) -> tuple[bool, str]:
    """Stop adding sessions? Every variant against the baseline at alpha / looks: a
    Bonferroni split of alpha over the planned looks keeps the chance of a false
    "significant" at most alpha however many looks are taken (conservative)."""
    from harness.analysis import stats  # scipy: only when a run takes looks

    # variant -> (repeat, session) -> [corrupted turns, turns]
    seen: dict[str, dict[tuple[int, int], list[int]]] = {v: {} for v in labels}
    for rec in iter_turns(turns_path):
        v = rec.get("variant", "")
        if v not in seen or rec.get("transport_error"):
            continue
        counts = seen[v].setdefault((rec.get("repeat", 0), rec["session"]), [0, 0])
        counts[0] += bool(rec.get("corrupted"))
        counts[1] += 1

    def arm(v: str) -> tuple[int, int, float]:
        ks, ms = [c[0] for c in seen[v].values()], [c[1] for c in seen[v].values()]
        return sum(ks), sum(ms), stats.cluster_design_effect(ks, ms)

    base = arm(labels[0])
    level = alpha / looks
    pending = []
    for v in labels[1:]:
        p, _ = stats.clustered_fisher(*base, *arm(v))
        if p >= level:
            pending.append(f"{v} p={p:.3g}")
    if not pending:
        return True, f"every comparison decided at p < {level:.3g} (alpha {alpha} / {looks} looks)"
    if look >= looks:
        return True, f"budget spent; undecided: {', '.join(pending)}"
    return False, f"undecided at p < {level:.3g}: {', '.join(pending)}"
