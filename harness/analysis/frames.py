"""The frames the plots draw and the tidy export: corruption rate per bucket of context or
requests in flight, the label mix, latencies, one row per turn (turns.parquet).

Each takes the frame of ``analysis.summary.prepare`` (one row per turn, ``is_transport`` and
``is_corrupted`` set).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import stats, turnframe
from harness.analysis.summary import CONF
from harness.labels import ALL_LABELS
from harness.record import safejson

log = logging.getLogger(__name__)


# ---- frames for plots ---------------------------------------------------------------------


def bucket_rates(
    df: pd.DataFrame, column: str, edges: Sequence[float], names: Sequence[str]
) -> pd.DataFrame:
    """Turn corruption rate per variant and bucket of ``column`` (edges[i] <= x < edges[i+1])."""
    ok = df[~df["is_transport"] & df[column].notna()]
    cut = pd.cut(ok[column], bins=list(edges), labels=list(names), right=False)
    rows = []
    for (variant, bucket), g in ok.groupby([ok["variant"], cut], observed=True, sort=True):
        k, n = int(g["is_corrupted"].sum()), int(len(g))
        lo, hi = stats.wilson(k, n, CONF)
        rows.append({"variant": variant, "bucket": bucket, "turns": n, "corrupted": k,
                     "rate": k / n, "lo": lo, "hi": hi})  # fmt: skip
    out = pd.DataFrame(
        rows, columns=["variant", "bucket", "turns", "corrupted", "rate", "lo", "hi"]
    )
    out["bucket"] = pd.Categorical(out["bucket"], categories=list(names), ordered=True)
    first_seen = {v: i for i, v in enumerate(pd.unique(df["variant"]))}
    out["_order"] = out["variant"].map(first_seen)
    out = out.sort_values(["_order", "bucket"], kind="stable").drop(columns="_order")
    return out.reset_index(drop=True)


def context_frame(df: pd.DataFrame, step: int = 8000, top: int = 80000) -> pd.DataFrame:
    edges = [*range(0, top + 1, step), np.inf]
    names = [f"{lo // 1000}-{(lo + step) // 1000}k" for lo in range(0, top, step)] + [
        f"{top // 1000}k+"
    ]
    return bucket_rates(df, "prompt_tokens", edges, names)


def inflight_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Power-of-two buckets of requests in flight: 1, 2-3, 4-7, ..."""
    top = int(df["inflight"].max()) if df["inflight"].notna().any() else 1
    edges: list[float] = [0, 2]
    names = ["0-1"]
    while edges[-1] <= top:
        lo = int(edges[-1])
        edges.append(lo * 2)
        names.append(f"{lo}-{lo * 2 - 1}")
    return bucket_rates(df, "inflight", edges, names)


def label_mix_frame(df: pd.DataFrame, order: Sequence[str] | None = None) -> pd.DataFrame:
    """Share of each label per variant (rows: variants in order; columns: labels)."""
    mix = pd.crosstab(df["variant"], df["label"], normalize="index")
    cols = [lab for lab in ALL_LABELS if lab in mix.columns]
    cols += [c for c in mix.columns if c not in cols]
    rows = [v for v in (order or list(pd.unique(df["variant"]))) if v in mix.index]
    return mix.loc[rows, cols]


def label_counts_frame(df: pd.DataFrame, order: Sequence[str] | None = None) -> pd.DataFrame:
    """Turns of each label per variant (rows: variants in order; columns: labels)."""
    counts = pd.crosstab(df["variant"], df["label"])
    cols = [lab for lab in ALL_LABELS if lab in counts.columns]
    cols += [c for c in counts.columns if c not in cols]
    rows = [v for v in (order or list(pd.unique(df["variant"]))) if v in counts.index]
    return counts.loc[rows, cols]


def corruption_events(df: pd.DataFrame) -> pd.DataFrame:
    """When each corrupted turn was sent: seconds since the first request of its variant and
    repeat (the time axis of the server metrics), with its label."""
    cols = ["variant", "repeat", "t", "label"]
    if "sent_at" not in df or df.empty:
        return pd.DataFrame(columns=cols)
    rows = df[df["sent_at"].notna()]
    first = rows.groupby(["variant", "repeat"])["sent_at"].transform("min")
    bad = rows[rows["is_corrupted"]]
    out = bad.assign(t=bad["sent_at"] - first[bad.index])
    return out[cols].reset_index(drop=True)


def latency_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[~df["is_transport"], ["variant", "ttft_s", "itl_s", "latency_s"]].reset_index(
        drop=True
    )


# ---- tidy export ---------------------------------------------------------------------------

#: rows a row group of turns.parquet holds: the text of one group is read from turns.jsonl,
#: written, and let go before the next
TIDY_CHUNK = 20_000
#: what the tidy export leaves out: the derived booleans of ``summary.prepare`` and the frame
#: reader's bookkeeping
_NOT_TIDY = ("is_transport", "is_cancelled", "is_harness", "is_corrupted", turnframe.TEXT_AT,
             turnframe.TEXT_KEPT, "content_digest")  # fmt: skip


def tidy_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per turn, one column per scalar fact; factors become ``factor_<name>``."""
    out = df.drop(columns=[c for c in _NOT_TIDY if c in df]).copy()
    if "factors" in out:
        facs = out.pop("factors").apply(lambda f: f if isinstance(f, Mapping) else {})
        flat = pd.DataFrame.from_records(list(facs), index=out.index).add_prefix("factor_")
        out = pd.concat([out, flat.astype("string")], axis=1)
    if "evidence" in out:
        out["evidence_offset"] = (
            out["evidence"]
            .apply(lambda e: e.get("offset") if isinstance(e, Mapping) else None)
            .astype("Int64")
        )
    for col in ("tool_calls", "evidence"):
        if col in out:
            out[col] = out[col].apply(_json_text)
    return out


def _json_text(x: object) -> str | None:
    """A value as JSON text (orjson where it can: a tenth of the standard library's time)."""
    if x is None:
        return None
    try:
        return safejson.dumps(x).decode("utf-8")
    except safejson.Unencodable:  # (nothing read back from turns.jsonl is)
        return str(x)


def _text_part(texts: Sequence[Mapping[str, Any]], index: pd.Index) -> pd.DataFrame:
    """The text columns of the tidy export for rows read back from turns.jsonl."""
    evidence = [t.get("evidence") for t in texts]
    return pd.DataFrame(
        {
            "content": [t.get("content") for t in texts],
            "reasoning": [t.get("reasoning") for t in texts],
            "tool_calls": [_json_text(t.get("tool_calls")) for t in texts],
            "evidence": [_json_text(e) for e in evidence],
            "evidence_offset": pd.array(
                [e.get("offset") if isinstance(e, Mapping) else None for e in evidence],
                dtype="Int64",
            ),
        },
        index=index,
    )


def _arrow() -> tuple[ModuleType, ModuleType] | None:
    """pyarrow and its parquet module, or None where pyarrow is missing."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        return None
    return pyarrow, pyarrow.parquet


def write_tidy(df: pd.DataFrame, path: Path | str, source: Path | None = None) -> Path:
    """Write turns.parquet (or turns.csv when pyarrow is missing); returns the path written.

    ``source``: the turns.jsonl a frame of ``analysis.turnframe`` was read from; the text
    columns are read back from it ``TIDY_CHUNK`` rows at a time, each chunk a row group, so
    that the export never holds every turn's text. The file is written beside and renamed
    into place: a crash keeps the previous one."""
    path = Path(path)
    streamed = source is not None and turnframe.TEXT_AT in df
    if streamed:
        text_cols = [*turnframe.TEXT_FIELDS, "evidence_offset"]
        tidy = tidy_frame(df.drop(columns=[c for c in text_cols if c in df]))
    else:
        tidy = tidy_frame(df)
    arrow = _arrow()
    if arrow is None:
        log.info("pyarrow not available; writing CSV instead of parquet")
        if streamed and source is not None:
            texts = turnframe.read_text(source, df[turnframe.TEXT_AT].astype(int))
            at = df[turnframe.TEXT_AT].astype(int)
            tidy = tidy.join(_text_part([texts.get(a, {}) for a in at], tidy.index))
        tidy.to_csv(path.with_suffix(".csv"), index=False)
        return path.with_suffix(".csv")
    pa, pq = arrow
    target = path.with_suffix(".parquet")
    partial = target.with_name(target.name + ".partial")
    schema = None
    with contextlib.ExitStack() as stack:
        writer = None
        for start in range(0, max(len(tidy), 1), TIDY_CHUNK):
            part = tidy.iloc[start : start + TIDY_CHUNK]
            if streamed and source is not None:
                at = df[turnframe.TEXT_AT].iloc[start : start + TIDY_CHUNK].astype(int)
                texts = turnframe.read_text(source, at)
                part = part.join(_text_part([texts.get(a, {}) for a in at], part.index))
            if schema is None:
                schema = _schema(pa, tidy, part)
            table = pa.Table.from_pandas(part, schema=schema, preserve_index=False)
            if writer is None:
                writer = stack.enter_context(pq.ParquetWriter(partial, schema))
            writer.write_table(table)
    partial.replace(target)
    return target


def _schema(pa: ModuleType, whole: pd.DataFrame, first: pd.DataFrame) -> Any:
    """One schema for every row group: the first group's (its pandas metadata too), with the
    scalar columns' types inferred from the whole frame (a column empty in the first group
    has values later) and the text columns' from their kind (strings, an integer offset)."""
    schema = pa.Schema.from_pandas(first, preserve_index=False)
    scalar = pa.Schema.from_pandas(whole, preserve_index=False)
    for i, name in enumerate(schema.names):
        if name in scalar.names:
            kind = scalar.field(name).type
        else:
            kind = pa.int64() if name == "evidence_offset" else pa.string()
        schema = schema.set(i, pa.field(name, kind))
    return schema
