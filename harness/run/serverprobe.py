"""The first contact with each variant's server, once it is ready and before its load.

``first_contact`` reads the server back (harness.target.serverfacts; judged by
harness.analysis.variantcheck), checks the target file's
verify rules, compares it with the variants before it, names the model (printed once, and
written into run.json when none was asked), asks once per run whether ``usage`` reports
cached tokens, and in raw mode checks the rendering on one turn (harness.client.raw). It records
one row in ``server_facts.jsonl`` and says every problem as a warning; with ``strict`` a
problem is a ConfigError before the load.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.analysis import variantcheck
from harness.client.chat import ChatClient
from harness.client.door import GENERATE_TIMEOUT_S, server_client
from harness.client.raw import RawClient, check_rendering
from harness.dialects import registry
from harness.errors import ConfigError
from harness.target import serverfacts
from harness.target.readiness import served_model
from harness.workload.matrix import Variant
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contact:
    """What the first contact needs to know of the run and the variant."""

    run_dir: Path
    variant: Variant
    repeat: int
    base_url: str
    described: Mapping[str, Any]  # the target's describe(): mode, command, env (masked)
    rules: Mapping[str, tuple[str, str]]  # "source.key" -> (expected, factor)
    model: str | None  # asked (--model or the target file); None: discover it
    model_source: str
    api_key: str | None
    api: str
    scenario: Scenario
    flush: Mapping[str, Any] | None
    strict: bool


def _note_model(run_dir: Path, model: str) -> None:
    """run.json gets the model the server named when none was asked."""
    path = run_dir / "run.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return
    if meta.get("model") is None:
        meta["model"] = model
        path.write_text(json.dumps(meta, indent=2) + "\n")


def probe_body(scenario: Scenario) -> dict[str, Any]:
    """A one-token request of the scenario's first turn (its system prompt, task and tools)."""
    messages: list[dict[str, Any]] = []
    if scenario.system_prompt:
        messages.append({"role": "system", "content": scenario.system_prompt})
    task = scenario.tasks[0] if scenario.tasks else "List the files of the project."
    messages.append({"role": "user", "content": task})
    body: dict[str, Any] = {"messages": messages, "max_tokens": 1, "temperature": 0.0}
    if scenario.tools:
        body["tools"] = scenario.openai_tools()
    return body


async def first_contact(c: Contact, say: Callable[[str], None]) -> dict[str, Any]:
    """The row recorded for this variant and repeat (``row["model"]``: the model to ask)."""
    config = await serverfacts.read_config(c.base_url, api_key=c.api_key)
    if c.described.get("mode") == "launch":
        config["launch"] = {"command": c.described.get("command"), "env": c.described.get("env")}
    card = config.get("models") or {}
    served = str(card["id"]) if card.get("id") is not None else None
    source = c.model_source
    model = c.model or served or await served_model(c.base_url, c.api_key)
    if model is None:  # the server named none: the requests say "default"
        model, source = "default", "the server's /v1/models named no model"
    earlier = variantcheck.load(c.run_dir)
    if not any(r.get("model") == model for r in earlier):
        say(f"model: {model} ({source})")
        if served is not None and served != model:
            say(f"note: the server lists the model as {served}")
        _note_model(c.run_dir, model)
    results = variantcheck.check(config, c.rules)
    kind = serverfacts.server_kind(config)
    cached = None
    if not any(r.get("cached_tokens_reported") is not None for r in earlier):
        cached = await reports_cached_tokens(c.base_url, model, api_key=c.api_key)
    rendering = None
    if c.api != "chat":  # raw mode: one turn both ways, the same prompt_tokens?
        probe = ChatClient(c.base_url, model=model, api_key=c.api_key, request_timeout=120.0)
        try:
            dialect = c.scenario.dialect
            if dialect == "auto":  # decided by the model's name, as the sessions will be
                dialect = registry.dialect_for_model(model) or dialect
            raw = RawClient(probe, c.api, dialect)
            rendering = await check_rendering(raw, probe_body(c.scenario))
        finally:
            await probe.aclose()
        say(("" if rendering["ok"] is not False else "warning: ") + rendering["message"])
    label = c.variant.label
    row: dict[str, Any] = {
        "variant": label, "factors": c.variant.as_dict(), "repeat": c.repeat,
        "base_url": c.base_url, "model": model, "served_model": served, "kind": kind,
        "sources": sorted(config), "config": config, "verify": results,
        "settings": variantcheck.settings_of(config, [r["key"] for r in results]),
        "flush_cache": dict(c.flush) if c.flush is not None else None,
        "cached_tokens_reported": cached, "rendering": rendering,
    }  # fmt: skip
    serverfacts.append(c.run_dir, row)
    problems = variantcheck.rule_failures(label, results)
    problems += [u["message"] for u in variantcheck.unapplied([*earlier, row])
                 if label in u["variants"]]  # fmt: skip
    for text in problems:
        say(f"warning: {text}")
    if cached is False:
        say(f"warning: {variantcheck.cache_report_warning(kind)}")
    if problems and c.strict:
        raise ConfigError(
            f"{problems[0]} (--strict-variants: the run stops before this variant's load; "
            "the turns of the variants before it are kept)"
        )
    return row


async def reports_cached_tokens(
    base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = GENERATE_TIMEOUT_S
) -> bool | None:
    """One tiny chat request: does ``usage`` carry ``prompt_tokens_details.cached_tokens``?
    None when the request itself failed."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Reply with the word ok."}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": False,
    }
    try:
        async with server_client(base_url, api_key=api_key, timeout=timeout_s) as http:
            resp = await http.post("/v1/chat/completions", json=body)
        doc = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        log.info("cache-report probe on %s failed: %s", base_url, exc)
        return None
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    return isinstance(details, dict) and details.get("cached_tokens") is not None
