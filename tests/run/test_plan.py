"""Run order (interleaved repeats) and the --dry-run plan text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.run.plan import format_plan, run_order
from harness.target.targetfile import default_sim_target, load_target
from harness.workload.matrix import parse_ab, variants

TARGETS = Path(__file__).resolve().parents[2] / "scenarios" / "targets"


def labels(order: list) -> list[str]:  # type: ignore[type-arg]
    return [f"{v.label}#{r}" for v, r in order]


def test_repeats_are_interleaved() -> None:
    vs = variants(parse_ab(["k=a,b"]))
    assert labels(run_order(vs, 3)) == ["k=a#0", "k=b#0", "k=a#1", "k=b#1", "k=a#2", "k=b#2"]
    assert labels(run_order(vs, 1)) == ["k=a#0", "k=b#0"]


def test_abba_reverses_every_other_round() -> None:
    vs = variants(parse_ab(["k=a,b,c"]))
    order = labels(run_order(vs, 2, scheme="abba"))
    assert order == ["k=a#0", "k=b#0", "k=c#0", "k=c#1", "k=b#1", "k=a#1"]


def test_every_variant_runs_repeats_times() -> None:
    vs = variants(parse_ab(["x=1,2", "y=p,q,r"]))
    order = run_order(vs, 4)
    assert len(order) == 24
    for v in vs:
        assert sorted(r for w, r in order if w == v) == [0, 1, 2, 3]


def test_bad_repeats_and_scheme() -> None:
    vs = variants([])
    with pytest.raises(UsageError, match="--repeats must be 1 or more"):
        run_order(vs, 0)
    with pytest.raises(UsageError, match="abab, abba"):
        run_order(vs, 1, scheme="random")


def test_sim_plan_shows_variants_order_commands_and_logs(tmp_path: Path) -> None:
    spec = default_sim_target()
    vs = variants(parse_ab(["index_k=fp8,bf16"]))
    text = format_plan(spec, run_order(vs, 2), tmp_path / "run", extra_args=["--seed", "7"])
    assert "target: sim (launch mode)" in text
    assert "variants (2), 2 repeat(s) each, 4 blocks" in text
    assert "index_k=fp8#1 -> index_k=bf16#1 -> index_k=fp8#2 -> index_k=bf16#2" in text
    assert f"{sys.executable} -m harness.sim --host 127.0.0.1 --port '<port>'" in text
    assert "--index-k bf16 --seed 7" in text
    assert str(tmp_path / "run" / "servers" / "index_k-fp8.log") in text
    assert "4 server starts" in text
    assert "url: http://127.0.0.1:<port>" in text


@pytest.mark.parametrize(
    ("name", "ab", "expect"),
    [
        ("sglang_dsv4.toml", ["index_k=fp8,bf16", "hicache=off,on"], "sglang.launch_server"),
        ("vllm.toml", ["prefix_cache=on,off"], "--no-enable-prefix-caching"),
        ("llama_server.toml", ["kv_cache=f16,q8_0"], "--cache-type-v q8_0"),
        ("endpoints.toml", ["index_k=fp8,bf16"], "url: http://dsv4-bf16.staging.example:30000"),
        ("staging_hook.toml", ["hicache=off,on"], "HARNESS_FACTOR_HICACHE=on"),
    ],
)
def test_shipped_targets_render_a_plan(
    tmp_path: Path, name: str, ab: list[str], expect: str
) -> None:
    spec = load_target(TARGETS / name)
    vs = variants(parse_ab(ab))
    text = format_plan(spec, run_order(vs, 1), tmp_path)
    assert expect in text
    for v in vs:
        assert f"[{v.label}]" in text


def test_hook_plan_shows_multiline_hooks(tmp_path: Path) -> None:
    spec = load_target(TARGETS / "staging_hook.toml")
    text = format_plan(spec, run_order(variants(parse_ab(["index_k=bf16"])), 1), tmp_path)
    assert "  before hook:\n    | set -eu\n" in text
    assert "hook reconfigurations" in text
    assert "NAMESPACE=llm-staging" in text


def test_plan_masks_secret_looking_env_values(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        'mode = "launch"\n[launch]\ncommand = ["srv", "--port", "{port}"]\n'
        'env = { HF_TOKEN = "hf_abc123", CUDA_VISIBLE_DEVICES = "0,1" }\n'
    )
    text = format_plan(load_target(path), run_order(variants([]), 1), tmp_path)
    assert "HF_TOKEN='***'" in text
    assert "hf_abc123" not in text
    assert "CUDA_VISIBLE_DEVICES=0,1" in text


def test_dry_run_says_how_many_turns_a_rare_rate_needs() -> None:
    from harness.analysis.stats import turns_needed
    from tests.cli.test_cli import harness

    proc = harness("run", "--dry-run", "--sessions", "48", "--detect", "0.0003:0.0001")
    assert proc.returncode == 0, proc.stderr
    need = turns_needed(3e-4, 1e-4)["turns"]  # the judge confirms: no false alarms assumed
    assert f"{need:,} turns a variant" in proc.stdout
    assert "too few" in proc.stdout
    # the headline on the text detector alone: its measured false alarms, by default
    from harness.analysis.tiers import DETECTOR_FALSE_ALARMS

    alone = turns_needed(3e-4, 1e-4, false_alarm=DETECTOR_FALSE_ALARMS["rate"])["turns"]
    assert alone > 5 * need
    rate = f"{100 * DETECTOR_FALSE_ALARMS['rate']:.2f}%"  # the held-out measure, 0.40%
    assert f"the text detector alone ({rate} of clean turns): {alone:,} turns" in proc.stdout
    off = harness("run", "--dry-run", "--sessions", "48", "--detect", "0.0003:0.0001",
                  "--judge", "off")  # fmt: skip
    assert off.returncode == 0, off.stderr
    assert f"{alone:,} turns a variant" in off.stdout
    assert f"false alarms {DETECTOR_FALSE_ALARMS['rate']:.3%} of clean turns" in off.stdout
    # --until-significant: each look at alpha / looks, as its loop tests
    looks = harness("run", "--dry-run", "--sessions", "48", "--detect", "0.0003:0.0001",
                    "--until-significant", "--max-sessions", "192")  # fmt: skip
    assert looks.returncode == 0, looks.stderr
    split = turns_needed(3e-4, 1e-4, alpha=0.05 / 4)["turns"]
    assert f"alpha 0.05 / 4 looks): {split:,} turns a variant" in looks.stdout
    assert "this run at most: 192 sessions" in looks.stdout
    bad = harness("run", "--dry-run", "--detect", "0.0003")
    assert bad.returncode == 2
    assert "RATE:BASELINE" in bad.stderr
    assert "turns taken as independent" in proc.stdout


def test_dry_run_takes_the_design_effect_an_earlier_run_reported() -> None:
    from harness.analysis.stats import turns_needed
    from harness.run.plan import rare_event_lines
    from tests.cli.test_cli import harness

    plain = turns_needed(3e-4, 0.0)
    line = rare_event_lines(9, 48, 3e-4, 0.0, design_effect=1.5)[0]
    # 9 turns a session at a design effect of 1.5: an intra-session correlation of 0.5 / 8
    assert f"{int(-(-plain['independent_turns'] * 1.5 // 1)):,} turns a variant" in line
    assert "design effect 1.5 as given, an intra-session correlation of 0.0625" in line
    proc = harness("run", "--dry-run", "--sessions", "48", "--detect", "0.0003:0:1.5")
    assert proc.returncode == 0, proc.stderr
    assert "design effect 1.5 as given" in proc.stdout
    for bad in ("0.0003:0:0.5", "0.0003:0:1:2", "0.0003:0:x"):
        out = harness("run", "--dry-run", "--detect", bad)
        assert out.returncode == 2, bad
        assert "--detect" in out.stderr
