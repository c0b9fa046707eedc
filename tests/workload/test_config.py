from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.workload.scenario import default_scenario_path, load_scenario


def test_default_scenario_loads_and_declares_valid_tools() -> None:
    s = load_scenario()
    assert s.name == "coding-agent"
    assert {t.name for t in s.tools} >= {"read_file", "search", "list_dir", "run_tests"}
    assert s.start_context < s.max_context
    tools = s.openai_tools()
    assert tools[0]["type"] == "function"
    assert tools[0]["function"]["parameters"]["type"] == "object"
    assert default_scenario_path().name == "coding_agent.toml"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('name = "x"\nworkload = "chat"\nsessions = "many"\n', "'sessions' must be an integer"),
        ('name = "x"\n', "needs at least one [[tools]] entry"),
        ('name = "x"\nworkload = "batch"\n', "workload 'batch' is not one of"),
        ('name = "x"\nsesions = 3\n', "unknown key(s) sesions"),
        ('name = "x"\ndialect = "xml"\n', "dialect 'xml' is not one of"),
        (
            'name = "x"\nworkload = "chat"\nstart_context = 9000\nmax_context = 100\n',
            "max_context (100) must be larger",
        ),
        ('name = "x"\n[[tools]]\nname = "f"\nkind = "nope"\n', "kind 'nope' is not one of"),
        (
            'name = "x"\n[[tools]]\nname = "f"\nkind = "echo"\n[tools.parameters]\ntype = 3\n',
            "not a valid JSON schema",
        ),
        ("name = \n", "not valid TOML"),
        ('name = "x"\nworkload = "chat"\nconcurrency = -1\n', "'concurrency' must be a whole"),
        ('name = "x"\nworkload = "chat"\n[sampling]\nmax_tokens = 9\n', "by the scenario's own"),
        ('name = "x"\nworkload = "chat"\n[sampling]\nstop = [1]\n', "give a number, a string"),
    ],
)
def test_bad_scenarios_say_what_to_fix(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as exc:
        load_scenario(path)
    assert message in str(exc.value)
    assert str(path) in str(exc.value)


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "nope.toml")


def test_overrides_are_validated() -> None:
    s = load_scenario().with_overrides(sessions=3, max_turns=None)
    assert s.sessions == 3
    assert s.max_turns == load_scenario().max_turns
    with pytest.raises(ConfigError, match="max_context"):
        s.with_overrides(max_context=10)


@pytest.mark.parametrize(
    ("what", "body"),
    [
        ("scenario", b'name = "caf\xe9"\n'),
        ("target", b'name = "caf\xe9"\nmode = "external"\n'),
        ("scenario", b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
        ("target", b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
    ],
)
def test_scenario_and_target_files_that_cannot_be_read_say_why(
    tmp_path: Path, what: str, body: bytes
) -> None:
    from harness.target.targetfile import load_target

    path = tmp_path / f"{what}.toml"
    path.write_bytes(body)
    load = load_scenario if what == "scenario" else load_target
    with pytest.raises(ConfigError) as exc:
        load(path)
    said = str(exc.value)
    assert said.startswith(f"{path}: ")
    assert "\n" not in said
    expected = f"not UTF-8 (byte 11); a {what} is UTF-8 TOML" if b"\xe9" in body else "too deep"
    assert expected in said


def test_the_shipped_kv_churn_scenario_sends_its_penalty() -> None:
    root = Path(__file__).resolve().parents[2]
    s = load_scenario(root / "scenarios" / "kv_churn.toml")
    assert dict(s.sampling) == {"repeat_penalty": 1.15}
    assert s.concurrency == 4
