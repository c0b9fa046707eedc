"""What a server says about itself: its effective configuration, read back once it is ready.

The sources (``SOURCES``), where the server exposes them:

* ``server_info``: SGLang's ``/server_info`` (older builds ``/get_server_info``): every server
  argument; the simulator's ``/server_info`` (every flag it runs with);
* ``props``: llama.cpp's ``/props`` (slots, context, generation defaults);
* ``models``: the first card of ``/v1/models`` (the served model; vLLM's ``max_model_len``,
  ``root``);
* ``launch``: the command and added environment the harness started (launch mode; never
  compared whole: the port differs by design). A rule on ``launch.env.NAME`` checks only what
  the harness sent, for a knob the server cannot report (a variable it reads at start).

One row per (variant, repeat) goes to ``server_facts.jsonl`` (``append``);
``harness.analysis.variantcheck`` judges the rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from harness.client.door import LOOK_TIMEOUT_S, MODELS_PATH, server_client
from harness.record.rundir import SERVER_FACTS_FILE

log = logging.getLogger(__name__)

#: source -> the URL paths tried in order (the first answering a JSON object wins)
SOURCES: Mapping[str, tuple[str, ...]] = {
    "server_info": ("/server_info", "/get_server_info"),
    "props": ("/props",),
    "models": (MODELS_PATH,),
    "launch": (),
}


async def read_config(
    base_url: str, *, api_key: str | None = None, timeout_s: float = LOOK_TIMEOUT_S
) -> dict[str, Any]:
    """The configuration sources that answer (``{"server_info": {...}, "models": {...}}``);
    a source that is missing, refuses or answers something else is left out."""
    out: dict[str, Any] = {}
    async with server_client(base_url, api_key=api_key, timeout=timeout_s) as http:
        for source, paths in SOURCES.items():
            for path in paths:
                try:
                    resp = await http.get(path)
                except httpx.HTTPError as exc:
                    log.debug("%s%s: %s", base_url, path, exc)
                    continue
                if resp.status_code != 200:
                    continue
                try:
                    doc = resp.json()
                except ValueError:
                    continue
                if source == "models":
                    cards = doc.get("data") if isinstance(doc, dict) else None
                    doc = cards[0] if isinstance(cards, list) and cards else None
                if isinstance(doc, dict):
                    out[source] = doc
                    break
    return out


def server_kind(config: Mapping[str, Any]) -> str | None:
    """sglang, vllm, llamacpp or sim, from what the server reports (None: unknown)."""
    info = config.get("server_info")
    if isinstance(info, Mapping):
        return "sim" if info.get("version") == "sim" else "sglang"
    if isinstance(config.get("props"), Mapping):
        return "llamacpp"
    card = config.get("models")
    if isinstance(card, Mapping):
        owner = str(card.get("owned_by") or "")
        if owner in ("vllm", "sglang", "llamacpp"):
            return owner
    return None


def append(run_dir: Path, row: Mapping[str, Any]) -> None:
    with open(run_dir / SERVER_FACTS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
