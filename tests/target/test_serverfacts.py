"""A variant is verified, not assumed: the server read back, the target file's rules checked,
two variants that report the same configuration caught; the model, the cache report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.analysis import variantcheck
from harness.errors import ConfigError
from harness.run import serverprobe
from harness.target import serverfacts
from harness.target.targetfile import load_target
from harness.workload.matrix import Variant
from tests.cli.test_cli_faults import TARGET, harness
from tests.standins import sim_processes

# ---- the rules in target files -------------------------------------------------------------


def _target(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(TARGET.format(extra="") + body)
    return path


def test_verify_rules_per_level_and_per_table(tmp_path: Path) -> None:
    spec = load_target(_target(tmp_path, """
[factors.kv.fp8]
args = ["--kv", "fp8"]
verify = { "server_info.kv_cache_dtype" = "fp8_e4m3", "props.total_slots" = 8 }
[factors.kv.auto]
args = []
[factors.hicache]
on = { args = ["--hicache", "on"] }
off = { args = [] }

[verify.hicache.on]
"server_info.enable_hierarchical_cache" = true
"""))  # fmt: skip
    rules = spec.rules_for(Variant((("kv", "fp8"), ("hicache", "on"))))
    assert rules == {
        "server_info.kv_cache_dtype": ("fp8_e4m3", "kv"),
        "props.total_slots": ("8", "kv"),
        "server_info.enable_hierarchical_cache": ("true", "hicache"),
    }
    assert spec.rules_for(Variant((("kv", "auto"), ("hicache", "off")))) == {}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('[factors.kv.a]\nverify = { "kv_cache_dtype" = "x" }', "source and a key joined"),
        ('[factors.kv.a]\nverify = { "nowhere.kv" = "x" }', "server_info, props, models"),
        ('[factors.kv.a]\nverify = { "props.x" = [1] }', "give a string, a number"),
        ('[factors.kv.a]\nargs = []\n[verify.kv.b]\n"props.x" = 1', "defines no level 'b'"),
        ("[factors.kv.a]\nargs = []\n[verify.kv]\na = 1", "give one table per level"),
    ],
)
def test_bad_verify_rules_say_what_to_fix(tmp_path: Path, body: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_target(_target(tmp_path, body))


# ---- comparing what the servers said --------------------------------------------------------


def _row(label: str, factors: dict[str, str], info: dict[str, Any], **kw: Any) -> dict[str, Any]:
    config = {"server_info": {"port": 30000 + len(label), "random_seed": hash(label), **info}}
    return {"variant": label, "factors": factors, "repeat": 0, "config": config, **kw}


def test_same_configuration_for_one_factor_is_caught_volatile_keys_aside() -> None:
    rows = [
        _row("index_k=fp8", {"index_k": "fp8"}, {"kv_cache_dtype": "auto"}),
        _row("index_k=bf16", {"index_k": "bf16"}, {"kv_cache_dtype": "auto"}),
    ]
    found = variantcheck.unapplied(rows)
    assert [u["variants"] for u in found] == [["index_k=fp8", "index_k=bf16"]]
    assert "same configuration (all 1 settings of its /server_info)" in found[0]["message"]
    rows[1]["config"]["server_info"]["kv_cache_dtype"] = "fp8_e4m3"
    assert variantcheck.unapplied(rows) == []
    # a rule names the keys that matter: the rest may differ
    rows[0]["verify"] = [{"key": "server_info.index_k_dtype", "factor": "index_k"}]
    found = variantcheck.unapplied(rows)
    assert found[0]["keys"] == ["server_info.index_k_dtype"]
    # two factors apart, or a server that reports nothing: no judgement
    rows[1]["factors"] = {"index_k": "bf16", "hicache": "on"}
    assert variantcheck.unapplied(rows) == []
    assert variantcheck.unapplied([{**r, "config": {}} for r in rows]) == []
    # /props alone shows too little: without a rule, no judgement
    props = [{**r, "config": {"props": {"total_slots": 8}}, "verify": []} for r in rows[:1]]
    props.append({**props[0], "variant": "index_k=bf16", "factors": {"index_k": "bf16"}})
    assert variantcheck.unapplied(props) == []


def test_rule_values_match_by_type() -> None:
    config = {"props": {"total_slots": 8, "flag": True, "name": "q8_0", "list": [1, 2]}}
    rules = {"props.total_slots": ("8", "f"), "props.flag": ("true", "f"),
             "props.name": ("q8_0", "f"), "props.list.1": ("2", "f"),
             "props.missing": ("x", "f")}  # fmt: skip
    ok = {r["key"]: r["ok"] for r in variantcheck.check(config, rules)}
    assert ok == {"props.total_slots": True, "props.flag": True, "props.name": True,
                  "props.list.1": True, "props.missing": False}  # fmt: skip
    failed = variantcheck.check(config, {"props.name": ("f16", "cache_type")})
    [text] = variantcheck.rule_failures("cache_type=f16", failed)
    assert "reports props.name = 'q8_0', the target file expects 'f16'" in text


async def test_read_config_from_the_simulator(make_sim: Callable[..., str]) -> None:
    url = make_sim(index_k="fp8", hicache="off")
    config = await serverfacts.read_config(url)
    assert set(config) == {"server_info", "models"}
    assert config["server_info"]["index_k_dtype"] == "fp8"
    assert config["server_info"]["enable_hierarchical_cache"] is False
    assert config["models"]["id"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert serverfacts.server_kind(config) == "sim"
    assert await serverprobe.reports_cached_tokens(url, "m") is True
    assert await serverprobe.reports_cached_tokens(make_sim(cache_report=False), "m") is False


# ---- whole runs against the simulator -------------------------------------------------------

HONOURED = """
[factors.index_k.fp8]
args = ["--index-k", "fp8"]
verify = { "server_info.index_k_dtype" = "fp8" }
[factors.index_k.bf16]
args = ["--index-k", "bf16"]
verify = { "server_info.index_k_dtype" = "bf16" }
"""
# levels that set a variable the simulator never reads (as upstream SGLang ignores an unknown
# SGLANG_* variable): both variants are the same server
IGNORED = HONOURED.replace('args = ["--index-k", "fp8"]', 'env = { SIM_INDEX_K_DTYPE = "fp8" }')
IGNORED = IGNORED.replace('args = ["--index-k", "bf16"]', 'env = { SIM_INDEX_K_DTYPE = "bf16" }')


def _run(tmp_path: Path, factors: str, *extra: str) -> tuple[Any, Path]:
    tmp_path.mkdir(exist_ok=True)
    target = tmp_path / "target.toml"
    target.write_text(TARGET.format(extra="") + factors)
    out = tmp_path / "run"
    proc = harness(
        "run", "--target", str(target), "--ab", "index_k=fp8,bf16", "--sessions", "2",
        "--turns", "2", "--speed", "100", "--seed", "9182", "--out", str(out), "--no-progress",
        "--junit", str(tmp_path / "junit.xml"), *extra,
    )  # fmt: skip
    return proc, out


@pytest.mark.slow
def test_a_factor_the_server_honours_passes_its_rules(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, HONOURED)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    assert "model: deepseek-ai/DeepSeek-V4-Flash (the target file)" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["server_warnings"] == []
    assert summary["model"] == "deepseek-ai/DeepSeek-V4-Flash"
    per = summary["servers"]["variants"]
    assert per["index_k=bf16"]["repeats"][0]["settings"] == {"server_info.index_k_dtype": "bf16"}
    assert all(r["ok"] for v in per.values() for r in v["repeats"][0]["verify"])
    report = (out / "report.md").read_text()
    assert "## Servers" in report
    assert "| index_k=fp8 | sim | launch, models, server_info | fp8 |" in report
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"model": "deepseek-ai/DeepSeek-V4-Flash"}


@pytest.mark.slow
def test_a_factor_the_server_ignores_is_a_warning_or_with_strict_an_error(
    tmp_path: Path,
) -> None:
    proc, out = _run(tmp_path, IGNORED)
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr
    assert "the server reports server_info.index_k_dtype = 'bf16', the target file" in said
    assert "expects 'fp8' for factor index_k" in said
    assert "variants index_k=fp8 and index_k=bf16 differ only in index_k" in said
    summary = json.loads((out / "summary.json").read_text())
    warnings = summary["server_warnings"]
    assert len(warnings) == 2
    assert any("the factor probably does not reach the server" in w for w in warnings)
    report = (out / "report.md").read_text()
    head = report.split("## Variants")[0]
    assert head.count("**Warning:**") == 2  # at the top, beside the verdict
    assert "server_warning" in (tmp_path / "junit.xml").read_text()
    assert "server_warnings" in (out / "summary.json").read_text()

    strict, out2 = _run(tmp_path / "strict", IGNORED, "--strict-variants")
    assert strict.returncode == 2, strict.stderr
    assert "harness: error: variant index_k=fp8: the server reports" in strict.stderr
    assert "--strict-variants" in strict.stderr
    assert not (out2 / "turns.jsonl").exists() or not (out2 / "turns.jsonl").read_text()
    assert sim_processes("--seed 9182") == []


@pytest.mark.slow
def test_an_endpoint_run_names_the_model_it_discovered_and_warns_of_no_cache_report(
    tmp_path: Path, make_sim: Callable[..., str]
) -> None:
    url = make_sim(cache_report=False, model="served-by-sim")
    out = tmp_path / "run"
    proc = harness(
        "run", "--endpoint", url, "--sessions", "2", "--turns", "2", "--out", str(out),
        "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "starting the server" not in proc.stderr
    assert "model: served-by-sim (discovered: the first model of /v1/models)" in proc.stderr
    assert proc.stderr.count("reports no cached prompt tokens") == 1  # at the start, not again
    assert "drop --cache-report off" in proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["model"] == "served-by-sim"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "served-by-sim"
    assert "Model: `served-by-sim`" in (out / "report.md").read_text()
    rows = variantcheck.load(out)
    assert rows[0]["cached_tokens_reported"] is False


@pytest.mark.slow
def test_raw_mode_checks_its_rendering_and_leaves_out_a_bos_the_server_adds(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target.toml"
    target.write_text(TARGET.format(extra=', "--raw-bos", "add"'))
    out = tmp_path / "run"
    proc = harness(
        "run", "--target", str(target), "--api", "generate", "--sessions", "4", "--turns", "3",
        "--speed", "100", "--workers", "2", "--seed", "9183", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "the server adds its own BOS to a prompt" in proc.stderr
    [row] = variantcheck.load(out)
    assert row["rendering"]["ok"] is True
    assert row["rendering"]["drop_bos"] is True
    assert row["rendering"]["raw_prompt_tokens"] == row["rendering"]["chat_prompt_tokens"]
    assert json.loads((out / "summary.json").read_text())["server_warnings"] == []
    # the workers sent no double BOS either: the first turns count as on the chat path
    chat = harness(
        "run", "--target", str(target), "--sessions", "4", "--turns", "1", "--speed", "100",
        "--seed", "9183", "--out", str(tmp_path / "chat"), "--no-progress",
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr

    def first_turns(run: Path) -> dict[int, int]:
        rows = [json.loads(line) for line in (run / "turns.jsonl").read_text().splitlines()]
        return {r["session"]: r["prompt_tokens"] for r in rows if r["turn"] == 0}

    assert len(first_turns(out)) == 4
    assert first_turns(out) == first_turns(tmp_path / "chat")


def test_warnings_gather_rules_flushes_renderings_and_the_cache_report_once() -> None:
    failed = {"key": "server_info.x", "factor": "f", "expected": "1", "actual": 2, "ok": False}
    flush = {"ok": False, "status": 400, "message": "HTTP 400: the server was busy"}
    rows = [
        _row("f=a", {"f": "a"}, {"x": 1}, verify=[], flush_cache=flush,
             cached_tokens_reported=False, kind="vllm"),
        _row("f=b", {"f": "b"}, {"x": 2}, verify=[failed], cached_tokens_reported=None,
             rendering={"ok": False, "message": "raw mode: the prompt the harness renders"}),
    ]  # fmt: skip
    said = variantcheck.warnings(rows)
    assert said[0].startswith("variant f=b: the server reports server_info.x = 2")
    assert (
        "variant f=a (repeat 0): the cache flush failed (HTTP 400: the server was busy)"
        in (said[1])
    )
    assert said[2] == "variant f=b: raw mode: the prompt the harness renders"
    assert said[3].endswith("start vLLM with --enable-prompt-tokens-details")
    assert len(said) == 4
    part = variantcheck.summary_part(rows)
    assert part["warnings"] == said
    assert part["variants"]["f=a"]["repeats"][0]["flush_cache"] == flush
