"""The sim's transport faults, slow start, crash and API key, seen with a plain httpx client."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from harness.errors import UsageError
from harness.sim.config import TRANSPORT_KINDS, SimConfig
from harness.sim.main import build_parser, config_from_args
from harness.sim.transport import draw
from tests.sim.common import TOOLS, chat, messages


def body(stream: bool, task: str = "Find the race in the cache.") -> dict[str, Any]:
    return {
        "model": "m",
        "messages": messages(task),
        "tools": TOOLS,
        "max_tokens": 512,
        "stream": stream,
        "seed": 7,
    }


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def events(text: str) -> list[bytes]:
    return [e[len("data: ") :].encode() for e in text.split("\n\n") if e.startswith("data: ")]


# ---------------------------------------------------------------- each fault on the wire


@pytest.mark.parametrize("stream", [True, False])
def test_error_rate_answers_500_or_503_with_an_openai_error(
    make_sim: Callable[..., str], stream: bool
) -> None:
    url = make_sim(error_rate=1.0)
    statuses = set()
    with httpx.Client(base_url=url) as client:
        for i in range(12):
            r = client.post("/v1/chat/completions", json=body(stream, f"task {i}"))
            assert r.headers["x-sim-injected"] == "transport:error"
            assert r.headers["content-type"].startswith("application/json")
            err = r.json()["error"]
            assert err["code"] == r.status_code
            assert err["message"]
            statuses.add(r.status_code)
        assert metric(client, "sim:chat_requests_total") == 12
        assert metric(client, "sglang:num_requests_total") == 0  # nothing was generated
    assert statuses == {500, 503}


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_closes_the_connection_part_way(
    make_sim: Callable[..., str], stream: bool
) -> None:
    url = make_sim(disconnect_rate=1.0)
    with (
        httpx.Client(base_url=url) as client,
        client.stream("POST", "/v1/chat/completions", json=body(stream)) as r,
    ):
        assert r.status_code == 200
        assert r.headers["x-sim-injected"] == "transport:disconnect"
        got = bytearray()

        def read_all() -> None:
            for part in r.iter_bytes():
                got.extend(part)

        with pytest.raises(httpx.RemoteProtocolError):
            read_all()
    if stream:
        assert got.startswith(b"data: ")  # some events arrived before the cut
        assert b"[DONE]" not in got
    else:
        assert 0 < len(got) < int(r.headers["content-length"])


@pytest.mark.parametrize("stream", [True, False])
def test_stall_sends_nothing_for_a_while_then_the_rest(
    make_sim: Callable[..., str], stream: bool
) -> None:
    clean = make_sim(fault_scale=0.0)
    stalled = make_sim(fault_scale=0.0, stall_rate=1.0, stall_seconds=0.6)
    with httpx.Client(base_url=clean) as client:
        expected = client.post("/v1/chat/completions", json=body(stream)).text
    # a client that waits less than the stall gives up ...
    with (
        httpx.Client(base_url=stalled, timeout=httpx.Timeout(5.0, read=0.2)) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/chat/completions", json=body(stream))
    # ... one that waits longer gets the whole response, the same as without the stall
    with httpx.Client(base_url=stalled, timeout=10.0) as client:
        r = client.post("/v1/chat/completions", json=body(stream))
    assert r.headers["x-sim-injected"] == "transport:stall"
    again = r.text
    strip = (lambda t: [orjson.loads(e) for e in events(t) if e != b"[DONE]"]) if stream else None
    if strip is None:
        ref, got = orjson.loads(expected), orjson.loads(again)
        ref.pop("id"), got.pop("id")
        ref.pop("created"), got.pop("created")
        assert ref["choices"] == got["choices"]
    else:
        ref_deltas = [c["choices"] for c in strip(expected)]
        got_deltas = [c["choices"] for c in strip(again)]
        assert got_deltas == ref_deltas
        assert again.endswith("data: [DONE]\n\n")


def test_error_event_mid_stream_then_done(make_sim: Callable[..., str]) -> None:
    url = make_sim(error_event_rate=1.0)
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/chat/completions", json=body(True))
        plain = client.post("/v1/chat/completions", json=body(False, "plain"))
    assert r.status_code == 200
    assert r.headers["x-sim-injected"] == "transport:error_event"
    docs = events(r.text)
    assert docs[-1] == b"[DONE]"
    error = orjson.loads(docs[-2])["error"]
    assert error["message"]
    assert error["code"] == 500
    assert "choices" in orjson.loads(docs[0])  # it came after real events
    # a non-streamed request cannot carry an event: it is answered cleanly
    assert plain.status_code == 200
    assert plain.headers["x-sim-injected"] == "none"


@pytest.mark.parametrize("stream", [True, False])
def test_bad_json_body_or_event(make_sim: Callable[..., str], stream: bool) -> None:
    url = make_sim(bad_json_rate=1.0)
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/chat/completions", json=body(stream))
    assert r.status_code == 200
    assert r.headers["x-sim-injected"] == "transport:bad_json"
    if not stream:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(r.content)
        return
    docs = events(r.text)
    assert docs[-1] == b"[DONE]"  # the framing is intact, one payload is not
    bad = 0
    for doc in docs[:-1]:
        try:
            orjson.loads(doc)
        except orjson.JSONDecodeError:
            bad += 1
    assert bad == 1


# ---------------------------------------------------------------- draws


def test_draw_follows_the_rates_and_error_events_need_a_stream() -> None:
    rates: tuple[tuple[str, float], ...] = (("error", 0.1), ("disconnect", 0.2), ("stall", 0.05))
    rates += (("error_event", 0.15), ("bad_json", 0.1))
    rng = random.Random(5)
    n = 20_000
    streamed = Counter(f.kind if (f := draw(rates, rng, True)) else None for _ in range(n))
    plain = Counter(f.kind if (f := draw(rates, rng, False)) else None for _ in range(n))
    for kind, rate in rates:
        assert abs(streamed[kind] / n - rate) < 0.015, (kind, streamed)
    assert plain["error_event"] == 0
    assert abs(plain[None] / n - 0.55) < 0.015  # error_event not drawn: clean


def test_faults_are_deterministic_per_request_and_resends_draw_again(
    make_sim: Callable[..., str],
) -> None:
    def kinds(url: str) -> list[str]:
        with httpx.Client(base_url=url) as client:
            out = []
            for i in range(6):
                for _ in range(3):  # the same conversation sent three times
                    r = client.post("/v1/chat/completions", json=body(False, f"t{i}"))
                    out.append(r.headers["x-sim-injected"])
            return out

    knobs = {"error_rate": 0.3, "bad_json_rate": 0.3, "seed": 11}
    first, second = kinds(make_sim(**knobs)), kinds(make_sim(**knobs))
    assert first == second  # same seed, same requests: same faults
    assert {"none", "transport:error", "transport:bad_json"} <= set(first)
    resent = [first[i : i + 3] for i in range(0, len(first), 3)]
    assert any(len(set(group)) > 1 for group in resent)  # a re-send is a new draw


def test_metrics_count_every_chat_request_and_each_fault(make_sim: Callable[..., str]) -> None:
    url = make_sim(error_rate=0.5, seed=3)
    with httpx.Client(base_url=url) as client:
        sent = [client.post("/v1/chat/completions", json=body(False, f"t{i}")) for i in range(10)]
        heads = [r.headers["x-sim-injected"] for r in sent]
        client.post("/v1/chat/completions", json={"messages": []})  # 400: still a request
        assert metric(client, "sim:chat_requests_total") == 11
        errors = heads.count("transport:error")
        assert metric(client, 'sim:injected_total{kind="transport:error"}') == errors
        assert metric(client, "sglang:num_requests_total") == 10 - errors


# ---------------------------------------------------------------- start, crash, key


def test_slow_start_health_is_503_until_ready(make_sim: Callable[..., str]) -> None:
    url = make_sim(slow_start=1.0, speed=1.0)
    with httpx.Client(base_url=url) as client:
        assert client.get("/health").status_code == 503
        assert client.get("/health_generate").status_code == 503
        assert chat(client, messages()).status_code == 200  # only health says "not yet"
        deadline = time.monotonic() + 20
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "never became healthy"
            time.sleep(0.05)
        assert client.get("/health_generate").status_code == 200


def test_crash_after_exits_on_the_request_after_n(make_sim_server: Callable[..., Any]) -> None:
    server = make_sim_server(crash_after=3)
    exits: list[int] = []
    server.app.state.sim.exit = exits.append  # os._exit in a real process
    with httpx.Client(base_url=server.url) as client:
        for i in range(3):
            assert chat(client, messages(f"t{i}")).status_code == 200
            assert exits == []
        chat(client, messages("one more"))
    assert exits == [70]


def test_api_key_is_required_on_the_api_but_not_on_health(make_sim: Callable[..., str]) -> None:
    url = make_sim(api_key="sk-sim-secret")
    with httpx.Client(base_url=url) as client:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sk-sim-secret"}):
            r = client.post("/v1/chat/completions", json=body(False), headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "AuthenticationError"
        assert client.get("/v1/models").status_code == 401
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        assert client.get("/metrics").status_code == 200
        good = {"authorization": "Bearer sk-sim-secret"}
        r = client.post("/v1/chat/completions", json=body(False), headers=good)
        assert r.status_code == 200
        assert client.get("/v1/models", headers=good).status_code == 200


# ---------------------------------------------------------------- knobs and flags


def test_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_TEST_KEY", "sk-flag-secret")
    argv = ["--error-rate", "0.1", "--disconnect-rate", "0.2", "--stall-rate", "0.05"]
    argv += ["--stall-seconds", "3", "--error-event-rate", "0.1", "--bad-json-rate", "0.15"]
    argv += ["--unencodable-rate", "0.05"]
    argv += ["--crash-after", "40", "--slow-start", "2.5", "--api-key-env", "SIM_TEST_KEY"]
    config = config_from_args(build_parser().parse_args(argv))
    rates = dict(config.transport_rates)
    assert set(rates) == set(TRANSPORT_KINDS)
    assert rates == {
        "error": 0.1,
        "disconnect": 0.2,
        "stall": 0.05,
        "error_event": 0.1,
        "bad_json": 0.15,
        "unencodable": 0.05,
    }
    assert (config.stall_seconds, config.crash_after, config.slow_start) == (3.0, 40, 2.5)
    assert config.api_key == "sk-flag-secret"
    assert "sk-flag-secret" not in repr(config)  # the config is logged at start


def test_missing_key_variable_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIM_TEST_KEY_UNSET", raising=False)
    args = build_parser().parse_args(["--api-key-env", "SIM_TEST_KEY_UNSET"])
    with pytest.raises(UsageError, match="SIM_TEST_KEY_UNSET is not set"):
        config_from_args(args)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"error_rate": 1.5}, "error_rate must be between 0 and 1"),
        ({"stall_rate": -0.1}, "stall_rate must be between 0 and 1"),
        ({"error_rate": 0.6, "disconnect_rate": 0.6}, "add up to more than 1"),
        ({"stall_seconds": 0.0}, "stall_seconds must be a positive number"),
        ({"crash_after": -1}, "crash_after must be zero or more"),
        ({"slow_start": -1.0}, "slow_start must be zero or more"),
        ({"api_key": ""}, "the API key is empty"),
    ],
)
def test_bad_knobs_say_what_to_fix(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        SimConfig(**fields)


def test_bad_flag_values_are_refused() -> None:
    parser = build_parser()
    for argv in (["--error-rate", "2"], ["--crash-after", "-3"], ["--slow-start", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


def test_unencodable_output_fails_as_llamacpp_does(make_sim: Callable[..., str]) -> None:
    url = make_sim(unencodable_rate=1.0)
    with httpx.Client(base_url=url) as client:
        streamed = client.post("/v1/chat/completions", json=body(True))
        plain = client.post("/v1/chat/completions", json=body(False, "plain"))
    # streamed: real events, then the encoder's complaint as an error event, then [DONE]
    assert streamed.status_code == 200
    assert streamed.headers["x-sim-injected"] == "unencodable"  # corruption, not transport
    docs = events(streamed.text)
    assert docs[-1] == b"[DONE]"
    assert "choices" in orjson.loads(docs[0])
    message = orjson.loads(docs[-2])["error"]["message"]
    assert message.startswith("[json.exception.type_error.316] invalid UTF-8 byte at index ")
    # not streamed: HTTP 500 with the same words
    assert plain.status_code == 500
    assert plain.headers["x-sim-injected"] == "unencodable"
    assert "invalid UTF-8 byte" in plain.json()["error"]["message"]
