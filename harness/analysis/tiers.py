"""The verdict's tiers in the numbers: which corrupted turns the headline rate counts.

Each corrupted turn was found in one of three ways (``harness.verdict.turn``):

- ``structural``: an envelope, schema or markup failure, found exactly by the parsers;
- ``suspect``: the text detector's guess (salad, a loop);
- ``confirmed``: a suspect that an oracle confirmed after the load: the model judge
  (``judge_confirmed``, analysis/judge.py), an exact oracle (``oracle_confirmed``), a lone
  re-send or another variant's answer. (Records of earlier versions also carry tier
  ``confirmed`` for a loop to the end of the output, which the text alone no longer decides.)

Per variant, when its suspects were judged (the server could score them), the headline
counts ``structural + confirmed`` and the suspects the judge acquitted or could not score are
reported apart; when none could be judged (an endpoint that cannot score, ``--judge off``) the
headline rests on the text detector alone, ``structural + suspect``, and says so beside the
detector's measured false-alarm rate (``DETECTOR_FALSE_ALARMS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from harness import labels as L

STRUCTURAL, CONFIRMED, SUSPECT = "structural", "confirmed", "suspect"
#: what the headline rate counts, by basis
CONFIRMED_BASIS = "structural+confirmed"
DETECTOR_BASIS = "structural+suspect"

#: The text detector's false alarms per turn on real, healthy agent turns of sources it was
#: neither fit nor tuned on (docs/detector.md, "Held out: real turns recorded by LLM
#: libraries"): rate, 95% Wilson interval, what was measured.
DETECTOR_FALSE_ALARMS: dict[str, Any] = {
    "rate": 0.0040,
    "ci": [0.0021, 0.0076],
    "turns": 2236,
    "data": "9 of 2,236 real healthy turns of nine held-out sources (the HTTP cassettes of "
    "LLM libraries' test suites: crewai, mirascope, langchain, magentic, chatlas, langsmith "
    "and three instrumentation projects; over 80 models; at most 0.60% a source with over "
    "100 turns): the seven of set 1 had their alarm classes read before the later detector "
    "changes (0.55% before them, 0.45% after: one of them added by the lexicon's stray-token "
    "reading), the two of set 2 had not (0 of 230); "
    "0.08% on the development set: docs/detector.md, 'Where it stands'",
}

_SUSPECT_LABELS = frozenset({L.TOKEN_SALAD, L.REPETITION})


def _tier_of_label(label: str) -> str:
    return SUSPECT if label in _SUSPECT_LABELS else STRUCTURAL


def mark(df: pd.DataFrame) -> None:
    """Add ``tier`` (filled from the label for records written before tiers), the booleans
    ``is_structural``, ``is_suspect`` (all the detector flagged), ``is_scored`` (judged by an
    oracle after the load), ``is_judged`` (that, or confirmed by its own text) and
    ``is_confirmed``, and set ``is_corrupted`` to what the headline counts (in place).
    Needs ``is_corrupted`` as flagged (``summary.prepare``)."""
    flagged = df["is_corrupted"].astype(bool)
    tier = df["tier"] if "tier" in df else pd.Series([None] * len(df), index=df.index)
    tier = tier.where(tier.notna() & (tier.astype(str) != ""), df["label"].map(_tier_of_label))
    df["tier"] = tier.where(flagged, "").astype(str)
    df["is_structural"] = flagged & (df["tier"] == STRUCTURAL)
    # records of earlier versions confirmed a loop to the end by its text; the detector
    # flagged them all
    by_text = flagged & (df["tier"] == CONFIRMED)
    df["is_suspect"] = flagged & ((df["tier"] == SUSPECT) | by_text)
    # another variant wrote the same bytes for the same request (analysis.crossvariant): the
    # model's own output, not the server's corruption; one cut short against it: corrupted
    reference = _bool_column(df, "reference")
    # re-sent alone after the load (confirm.jsonl): the same bytes alone are the model's own
    # answer to that request; clean alone, the load's doing
    alone = _bool_column(df, "alone")
    again = df["is_suspect"] & (alone == "model_own")
    clean_alone = df["is_suspect"] & (alone == "confirmed_under_load")
    same = (df["is_suspect"] & (reference == "same")) | again
    cut = reference == "cut_short"
    exact = by_text & ~same
    judge = _bool_column(df, "judge_confirmed")
    oracle = _bool_column(df, "oracle_confirmed")
    scored = df["is_suspect"] & (judge.notna() | oracle.notna() | again | clean_alone)
    df["is_scored"] = scored  # judged by an oracle after the load
    df["is_judged"] = scored | exact | same
    by_model = df["is_suspect"] & ((judge == True) | (oracle == True) | clean_alone) & ~same  # noqa: E712
    df["is_confirmed"] = exact | by_model | cut
    df["is_reference_acquitted"] = df["is_suspect"] & (reference == "same")
    df["is_reference_confirmed"] = cut
    df["is_alone_acquitted"] = again
    df["is_alone_confirmed"] = clean_alone & df["is_confirmed"]
    judged_variants = set(df.loc[scored, "variant"])
    by_detector = ~df["variant"].isin(judged_variants) & ~same
    df.loc[df["is_confirmed"], "tier"] = CONFIRMED
    df["is_corrupted"] = df["is_structural"] | df["is_confirmed"] | (df["is_suspect"] & by_detector)


def merge_judge(df: pd.DataFrame, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``judge_confirmed`` of the judge's decided rows (analysis.judge.decide) on the turns
    they judged: what the run merges into turns.jsonl when it ends, read before that too (a
    run still going, or cut short)."""
    if not rows or df.empty:
        return df
    key = ["variant", "repeat", "session", "turn", "attempt"]
    got = {tuple(r.get(k) for k in key): bool(r["judge_confirmed"]) for r in rows}
    keys = zip(*(df[k] for k in key), strict=True)
    decided = pd.Series([got.get(tuple(k)) for k in keys], index=df.index, dtype=object)
    df = df.copy()
    old = _bool_column(df, "judge_confirmed")
    df["judge_confirmed"] = decided.where(decided.notna(), old)
    return df


def merge_oracles(df: pd.DataFrame, evidence: Mapping[tuple[Any, ...], list[str]]) -> pd.DataFrame:
    """``oracle_confirmed`` (True) and ``confirmed_by`` (the oracles' names) on the turns an
    exact oracle says are wrong (analysis.oracles.oracle_evidence): a suspect among them is
    confirmed."""
    if not evidence or df.empty:
        return df
    names = [evidence.get(k) for k in _row_keys(df)]
    df = df.copy()
    df["confirmed_by"] = pd.Series(names, index=df.index, dtype=object)
    df["oracle_confirmed"] = df["confirmed_by"].map(lambda n: True if n else None)
    return df


def merge_alone(df: pd.DataFrame, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``alone``: what a flagged send gave when re-sent alone after the load (confirm.jsonl):
    ``model_own`` (the same answer, byte for byte: what the model writes for this request
    without any load), ``reproduces_alone`` (corrupted alone too, otherwise: a corruption that
    needs no load stays counted) or ``confirmed_under_load`` (clean alone); undecided ones
    left out."""
    found = {}
    for r in rows:
        status = r.get("status")
        if status not in ("reproduces_alone", "confirmed_under_load"):
            continue
        if status == "reproduces_alone" and r.get("same_as_recorded"):
            status = "model_own"
        found[tuple(r.get(k) for k in ("variant", "repeat", "session", "turn", "attempt"))] = status
    if not found or df.empty:
        return df
    df = df.copy()
    df["alone"] = pd.Series([found.get(k) for k in _row_keys(df)], index=df.index, dtype=object)
    return df


def merge_reference(
    df: pd.DataFrame, evidence: Mapping[tuple[Any, ...], tuple[str, str]]
) -> pd.DataFrame:
    """``reference`` (``cut_short`` or ``same``) on the turns compared with another variant's
    answer to the same request (analysis.crossvariant.evidence), ``confirmed_by`` naming the
    variant where the answer was cut short against it."""
    if not evidence or df.empty:
        return df
    found = [evidence.get(k) for k in _row_keys(df)]
    df = df.copy()
    df["reference"] = pd.Series([f[0] if f else None for f in found], index=df.index, dtype=object)
    before = (
        df["confirmed_by"] if "confirmed_by" in df else pd.Series([None] * len(df), index=df.index)
    )
    df["confirmed_by"] = [
        [*(b if isinstance(b, list) else []), f"reference ({f[1]})"]
        if f and f[0] == "cut_short"
        else b
        for b, f in zip(before, found, strict=True)
    ]
    return df


def _row_keys(df: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Each row's ``(variant, repeat, session, turn, attempt)`` (0 where a column is absent)."""
    key = ["variant", "repeat", "session", "turn", "attempt"]
    cols = [df[k] if k in df else pd.Series([0] * len(df), index=df.index) for k in key]
    return [tuple(k) for k in zip(*cols, strict=True)]


def _bool_column(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df:
        return pd.Series([None] * len(df), index=df.index, dtype=object)
    return df[name].astype(object).where(df[name].notna(), None)


def variant_tiers(ok: pd.DataFrame) -> dict[str, Any]:
    """The tier counts of one variant's classified turns, and the basis of its headline."""
    suspects = ok[ok["is_suspect"]]
    # judged: the judge or an oracle scored some, or another variant wrote every suspect
    decided = suspects["is_scored"] | suspects.get("is_reference_acquitted", False)
    judged = bool(suspects["is_scored"].any() or decided.all()) if len(suspects) else False
    acquitted = suspects[suspects["is_judged"] & ~suspects["is_confirmed"]]
    unjudged = suspects[~suspects["is_judged"]]
    out: dict[str, Any] = {
        "structural_turns": int(ok["is_structural"].sum()),
        "confirmed_turns": int(ok["is_confirmed"].sum()),
        "suspect_turns": int(len(suspects)),
        "headline_basis": CONFIRMED_BASIS if judged or not len(suspects) else DETECTOR_BASIS,
        "tiers": {
            STRUCTURAL: int(ok["is_structural"].sum()),
            CONFIRMED: int(ok["is_confirmed"].sum()),
            "suspect_acquitted": int(len(acquitted)),
            "suspect_not_judged": int(len(unjudged)) if judged else 0,
            "suspect_unconfirmed": int(len(unjudged)) if not judged else 0,
        },
    }
    if "is_reference_acquitted" in ok:
        out["reference"] = {
            "acquitted": int(ok["is_reference_acquitted"].sum()),
            "cut_short": int(ok["is_reference_confirmed"].sum()),
        }
        out["alone"] = {
            "acquitted": int(ok["is_alone_acquitted"].sum()),
            "confirmed": int(ok["is_alone_confirmed"].sum()),
        }
    apart = acquitted if judged else suspects.iloc[0:0]
    apart = pd.concat([apart, unjudged]) if judged else apart
    if len(apart):
        # a turn's attempts (a suspect answer sent again) are one example, with their count
        turn = [k for k in ("repeat", "session", "turn") if k in apart]
        attempts = apart.groupby(turn, sort=False)[turn[-1]].transform("size")
        first = apart.assign(attempts=attempts).drop_duplicates(turn)
        out["suspect_examples"] = [_example(r) for _, r in first.head(3).iterrows()]
    return out


def _example(row: Mapping[str, Any]) -> dict[str, Any]:
    text = str(row.get("content") or "")
    return {
        "session": int(row["session"]),
        "turn": int(row["turn"]),
        "attempt": int(row["attempt"]),
        "attempts": int(row.get("attempts") or 1),
        "label": str(row["label"]),
        "judged": bool(row["is_judged"]),
        "text": text[:160] + ("..." if len(text) > 160 else ""),
    }


def headline(variants: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run's headline rates count: the tiers, and the detector's measured false
    alarms when any variant rests on it alone."""
    alone = [v["label"] for v in variants if v.get("headline_basis") == DETECTOR_BASIS]
    out: dict[str, Any] = {"counts": CONFIRMED_BASIS if not alone else DETECTOR_BASIS}
    if alone:
        out["text_detector_alone"] = alone
        out["detector_false_alarms"] = DETECTOR_FALSE_ALARMS
    return out


def headline_line(summary: Mapping[str, Any]) -> str:
    """One sentence: which tiers the headline rates count."""
    head = summary.get("headline") or {}
    apart = sum(
        (v.get("tiers") or {}).get("suspect_acquitted", 0)
        + (v.get("tiers") or {}).get("suspect_not_judged", 0)
        for v in summary.get("variants", ())
    )
    if head.get("counts") == DETECTOR_BASIS:
        fa = DETECTOR_FALSE_ALARMS
        alone = head.get("text_detector_alone", [])
        where = "" if len(alone) == len(summary.get("variants", ())) else f" in {', '.join(alone)}"
        return (
            f"rates count structural + suspect turns: the text detector alone{where}, no "
            f"server scoring confirmed its suspects; its measured false alarms: "
            f"{100 * fa['rate']:.2f}% of healthy turns ({100 * fa['ci'][0]:.2f}-"
            f"{100 * fa['ci'][1]:.2f}%)"
        )
    line = "rates count structural + confirmed turns"
    if apart:
        line += f"; {apart} unconfirmed suspects apart (report.md)"
    return line


def markdown(summary: Mapping[str, Any]) -> list[str]:
    """The report's section on the verdict's tiers: what each variant's rates count, and the
    suspects left out of them with a few examples."""
    rows = [v for v in summary.get("variants", ()) if "tiers" in v]
    if not rows or not any(v.get("suspect_turns") or v.get("structural_turns") for v in rows):
        return []
    out = ["", "## How the corrupted turns were found", "",
           "Structural: an envelope, schema or markup failure the parsers found exactly. "
           "Confirmed: a suspect of the text detector that the model judge (the same model "
           "scoring the output alone, teacher-forced), an exact oracle or a clean answer when "
           "re-sent alone confirmed, or (greedy runs) an answer cut short against another "
           "variant's answer to the same request. "
           "A suspect that another variant wrote byte for byte is the model's own output: "
           "acquitted by the reference. The rates above count structural + confirmed turns, "
           "or structural + suspect turns where no suspect could be judged (the text "
           "detector alone).", "",
           "| variant | structural | confirmed | suspects acquitted | "
           "suspects not judged | rates count |", "|---|---|---|---|---|---|"]  # fmt: skip
    for v in rows:
        t = v["tiers"]
        unjudged = t.get("suspect_not_judged", 0) + t.get("suspect_unconfirmed", 0)
        out.append(f"| {v['label']} | {t[STRUCTURAL]} | {t[CONFIRMED]} | "
                   f"{t.get('suspect_acquitted', 0)} | {unjudged} | "
                   f"{str(v.get('headline_basis', '')).replace('+', ' + ')} |")  # fmt: skip
    lone = [(v["label"], v["alone"]) for v in rows if v.get("alone")]
    if any(r["acquitted"] or r["confirmed"] for _, r in lone):
        parts = [f"`{label}` {r['confirmed']} clean alone (confirmed), {r['acquitted']} "
                 "the same answer alone (the model's own: acquitted)"
                 for label, r in lone]  # fmt: skip
        out += ["", "The flagged turns re-sent alone after the load: " + "; ".join(parts) + "."]
    refs = [(v["label"], v["reference"]) for v in rows if v.get("reference")]
    if any(r["acquitted"] or r["cut_short"] for _, r in refs):
        parts = [f"`{label}` {r['cut_short']} cut short, {r['acquitted']} suspects "
                 "acquitted (the same bytes)" for label, r in refs]  # fmt: skip
        out += ["", "Against the other variants' answers to the same requests (greedy): "
                + "; ".join(parts) + "."]  # fmt: skip
    for v in rows:
        examples = v.get("suspect_examples") or []
        if examples:
            out += ["", f"Suspects of `{v['label']}` left out of its rates:", ""]
            for e in examples:
                how = "judged healthy" if e["judged"] else "not judged"
                text = e["text"].replace("`", "'").replace("\n", " ")
                sent = f", sent {e['attempts']} times" if e.get("attempts", 1) > 1 else ""
                out.append(f"- session {e['session']} turn {e['turn']} ({e['label']}, {how}"
                           f"{sent}): `{text}`")  # fmt: skip
    return out
