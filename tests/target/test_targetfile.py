"""Target files: the shipped examples load; bad files say which file and what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ConfigError, UsageError
from harness.target.launch import HookTarget, LaunchTarget, make_target
from harness.target.spec import substitute
from harness.target.targetfile import default_sim_target, load_target
from harness.workload.matrix import Variant, parse_ab, variants

TARGETS = Path(__file__).resolve().parents[2] / "scenarios" / "targets"
SHIPPED = sorted(TARGETS.glob("*.toml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_every_shipped_target_file_loads() -> None:
    names = {p.name for p in SHIPPED}
    assert {
        "sim.toml",
        "sglang_dsv4.toml",
        "vllm.toml",
        "llama_server.toml",
        "endpoints.toml",
        "staging_hook.toml",
    } <= names
    modes = {p.name: load_target(p).mode for p in SHIPPED}
    assert modes["sim.toml"] == "launch"
    assert modes["endpoints.toml"] == "endpoint"
    assert modes["staging_hook.toml"] == "hook"


def test_default_sim_target_maps_the_incident_factors() -> None:
    spec = default_sim_target()
    assert spec.mode == "launch"
    assert spec.levels("index_k") == ("fp8", "bf16")
    assert spec.levels("hicache") == ("on", "off")
    assert spec.levels("topk") == ("v1", "v2")
    assert spec.factors["topk"]["v1"].args == ("--topk", "v1")


def test_sglang_file_builds_the_documented_command(tmp_path: Path) -> None:
    spec = load_target(
        TARGETS / "sglang_dsv4.toml", var_overrides={"model": "/models/dsv4", "tp": "4"}
    )
    v = variants(parse_ab(["index_k=bf16", "hicache=on", "topk=v1"]))[0]
    target = make_target(spec, v, tmp_path)
    assert isinstance(target, LaunchTarget)
    argv = target.argv(30000)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(argv)
    for piece in (
        "--model-path /models/dsv4",
        "--port 30000",
        "--tp 4",
        "--tool-call-parser deepseekv4",
        "--reasoning-parser deepseek-v4",
        "--enable-metrics",
        "--enable-cache-report",
        "--enable-hierarchical-cache --hicache-ratio 2",
    ):
        assert piece in joined
    env = target.added_env(30000)
    assert env["SGLANG_OPT_USE_TOPK_V2"] == "0"
    assert env["SGLANG_INDEX_K_DTYPE"] == "bf16"
    assert spec.ready.paths == ("/health_generate",)
    assert spec.ready.timeout_s == 1800


def test_vllm_and_llama_server_commands(tmp_path: Path) -> None:
    vllm = make_target(load_target(TARGETS / "vllm.toml"), Variant(()), tmp_path)
    assert isinstance(vllm, LaunchTarget)
    cmd = " ".join(vllm.argv(8000))
    assert "--enable-auto-tool-choice --tool-call-parser deepseek_v32" in cmd
    assert vllm.spec.ready.paths == ("/health",)
    llama = make_target(
        load_target(TARGETS / "llama_server.toml"),
        variants(parse_ab(["kv_cache=q8_0", "slots=16"]))[0],
        tmp_path,
    )
    assert isinstance(llama, LaunchTarget)
    argv = llama.argv(8080)
    assert argv[:3] == ["llama-server", "-m", "model.gguf"]
    assert "--metrics" in argv
    assert "--jinja" in argv
    assert argv[-2:] == ["-np", "16"]  # the level's -np comes last and wins
    assert "--cache-type-k" in argv


def test_endpoint_file_matches_labels_in_any_order(tmp_path: Path) -> None:
    spec = load_target(TARGETS / "endpoints.toml")
    v = Variant((("hicache", "on"), ("index_k", "bf16")))
    assert spec.endpoint_for(v).startswith("http://dsv4-bf16-hicache.")
    assert spec.endpoint_for(Variant(())).startswith("http://dsv4-fp8.")
    with pytest.raises(UsageError, match="levels defined: bf16, fp8"):
        spec.check_variant(Variant((("index_k", "fp16"),)))


def test_hook_file_env_and_placeholders(tmp_path: Path) -> None:
    spec = load_target(TARGETS / "staging_hook.toml", var_overrides={"namespace": "qa"})
    assert spec.base_url == "http://dsv4.qa.svc.example:30000"
    target = make_target(spec, variants(parse_ab(["hicache=on"]))[0], tmp_path)
    assert isinstance(target, HookTarget)
    env = target.hook_env("before")
    assert env["NAMESPACE"] == "qa"
    assert env["HARNESS_FACTOR_HICACHE"] == "on"
    assert env["HICACHE_ARGS"] == "--enable-hierarchical-cache --hicache-ratio 2"
    assert spec.hook is not None
    assert '"${INDEX_K_DTYPE:-fp8}"' in (spec.hook.before or "")  # hook text is never rewritten


def test_substitute_fills_placeholders_and_keeps_escaped_braces() -> None:
    assert substitute("{a}-{{b}}-{a}", {"a": "1"}) == "1-{b}-1"
    with pytest.raises(KeyError):
        substitute("{nope}", {})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('mode = "launch"\n[launch]\ncommand = ["x", "{port}"', "not valid TOML"),
        ('mode = "serve"', "'mode' must be one of launch, endpoint, hook"),
        ('mode = "launch"', "[launch] command: give the server command"),
        ('mode = "launch"\n[launch]\ncommand = "x --port {port}"', "give a list of strings"),
        ('mode = "launch"\n[launch]\ncommand = ["x"]', "must contain {port}"),
        ('mode = "launch"\n[launch]\ncommand = ["x", "{port}", "{gpu}"]', "unknown placeholder"),
        ('mode = "launch"\ncolour = 1\n[launch]\ncommand = ["x", "{port}"]', "unknown key(s)"),
        (
            'mode = "launch"\n[launch]\ncommand = ["x", "{port}"]\n[factors.k.a]\nargz = []',
            "[factors.k.a]: unknown key(s) argz",
        ),
        (
            'mode = "launch"\n[launch]\ncommand = ["x", "{port}"]\n[factors.k."a b"]\n',
            "a level may only hold",
        ),
        (
            'mode = "launch"\n[launch]\ncommand = ["x", "{port}"]\n[factors.k.a]\nenv = {X = true}',
            "give a string or a number",
        ),
        (
            'mode = "launch"\n[launch]\ncommand = ["x", "{port}"]\n[ready]\ntimeout_s = -1',
            "positive number of seconds",
        ),
        (
            'mode = "launch"\n[launch]\ncommand = ["x", "{port}"]\n[ready]\npaths = ["health"]',
            "[ready] paths",
        ),
        ('mode = "endpoint"', "[endpoints]: map each variant label"),
        ('mode = "endpoint"\n[endpoints]\ndefault = "localhost:1"', "give a base URL"),
        ('mode = "endpoint"\n[endpoints]\n"k" = "http://a:1"', "a key is 'default' or"),
        (
            'mode = "endpoint"\n[endpoints]\n"a=1,b=2" = "http://a:1"\n"b=2,a=1" = "http://b:1"',
            "repeats another entry",
        ),
        ('mode = "hook"\nbase_url = "http://a:1"\n[hook]\n', "give a 'before' and/or"),
        ('mode = "hook"\n[hook]\nbefore = "true"', "base_url: give a base URL"),
        (
            'mode = "hook"\nbase_url = "http://a:1"\n[hook]\nbefore = "true"\n'
            '[factors.k.a]\nargs = ["--x"]',
            "'args' only apply in launch mode",
        ),
        (
            'mode = "hook"\nbase_url = "http://a:{port}"\n[hook]\nbefore = "true"',
            "unknown placeholder {port}",
        ),
        ('mode = "endpoint"\n[launch]\ncommand = []\n[endpoints]\ndefault = "http://a:1"', "only"),
    ],
)
def test_bad_files_name_the_file_and_the_fix(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_target(path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="target file not found"):
        load_target(tmp_path / "nope.toml")


def test_unknown_override_is_a_usage_error(tmp_path: Path) -> None:
    path = write(
        tmp_path, 'mode = "launch"\n[vars]\ngpu = 0\n[launch]\ncommand = ["x", "{port}", "{gpu}"]'
    )
    assert load_target(path, var_overrides={"gpu": "3"}).vars["gpu"] == "3"
    with pytest.raises(UsageError, match=r"no such variable \(its \[vars\]: gpu\)"):
        load_target(path, var_overrides={"gpus": "3"})


def test_undefined_factor_and_level_messages() -> None:
    spec = default_sim_target()
    with pytest.raises(UsageError) as info:
        spec.check_variant(Variant((("index_k", "fp16"),)))
    msg = str(info.value)
    assert "sim.toml" in msg
    assert "'index_k'" in msg
    assert "levels defined: fp8, bf16" in msg
    with pytest.raises(UsageError, match="defines factors: index_k, hicache, topk"):
        spec.check_variant(Variant((("speed", "2"),)))


def test_spec_is_frozen() -> None:
    spec = default_sim_target()
    with pytest.raises(AttributeError):
        spec.mode = "endpoint"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.factors["index_k"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        spec.factors["index_k"]["fp16"] = spec.factors["index_k"]["fp8"]  # type: ignore[index]


def test_the_deterministic_targets_say_so_for_the_replay_oracle() -> None:
    assert load_target(TARGETS / "sglang_deterministic.toml").deterministic
    vllm = load_target(TARGETS / "vllm_deterministic.toml")
    assert vllm.deterministic
    assert vllm.launch is not None
    assert vllm.launch.env["VLLM_BATCH_INVARIANT"] == "1"
    assert not load_target(TARGETS / "sim.toml").deterministic


def test_any_level_fills_in_its_value(tmp_path: Path) -> None:
    """A ``"*"`` level takes any level ``--ab`` gives (an engine's version), ``{level}``
    filled in; a level of its own table wins; the other factors still check their levels."""
    spec = load_target(TARGETS / "llamacpp_versions.toml")
    args = make_target(spec, Variant((("llamacpp", "0.1.11"),)), tmp_path).argv(1234)
    assert args[-2:] == ["--engine", "0.1.11"]
    installed = make_target(spec, Variant((("llamacpp", "installed"),)), tmp_path).argv(1234)
    assert "--engine" not in installed
    with pytest.raises(UsageError, match="has no level 'x'"):
        spec.check_variant(Variant((("defrag", "x"),)))
    bad = write(tmp_path, 'mode = "launch"\n[launch]\ncommand = ["x"]\n'
                '[factors.v."*"]\nargs = ["--engine", "{lvl}"]\n')  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown placeholder \{lvl\}"):
        load_target(bad)
