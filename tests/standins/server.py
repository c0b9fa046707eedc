"""A stand-in inference server for the launch tests (stdlib only, loopback only).

    python server.py --port N [--delay S] [--die] [--never-ready] [--spawn-child FILE]
                     [--flavor sglang|vllm|llamacpp|none] [--max-life S]

--delay: sleep before listening (a slow start). --die: print an error and exit 1 during
start-up. --never-ready: listen but answer 503 on every readiness path. --spawn-child: start a
grandchild process in the same process group and write its pid to FILE. --flavor: the
/metrics text served (none: 404). --max-life: exit by itself after S seconds whatever happens,
so that a failed test never leaves it running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = {
    "sglang": (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\n'
        'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0\n'
        'sglang:token_usage{model_name="m",tp_rank="0"} 0.25\n'
        'sglang:cache_hit_rate{model_name="m",tp_rank="0"} 0.5\n'
    ),
    "vllm": (
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.125\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 750.0\n'
    ),
    "llamacpp": (
        "llamacpp:requests_processing 1\n"
        "llamacpp:requests_deferred 4\n"
        "llamacpp:prompt_tokens_total 300\n"
        "llamacpp:prompt_tokens_cached_total 100\n"
    ),
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--die", action="store_true")
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--spawn-child", default=None)
    p.add_argument("--flavor", default="sglang", choices=[*METRICS, "none"])
    p.add_argument("--max-life", type=float, default=60.0)
    args = p.parse_args()

    killer = threading.Timer(args.max_life, lambda: os._exit(3))
    killer.daemon = True
    killer.start()
    print(
        f"standin: starting on port {args.port} env STANDIN_MARK={os.environ.get('STANDIN_MARK')}"
    )
    print(f"standin: argv {sys.argv[1:]}", flush=True)
    if args.die:
        print("standin: ERROR: cannot allocate the KV cache (simulated)", flush=True)
        return 1
    if args.spawn_child:
        child = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({args.max_life})"],
            stdin=subprocess.DEVNULL,
        )
        with open(args.spawn_child, "w") as fh:
            fh.write(str(child.pid))
    time.sleep(args.delay)

    flushes = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            sys.stdout.write("standin: " + fmt % a + "\n")
            sys.stdout.flush()

        def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate", "/v1/models"):
                if args.never_ready:
                    self._send(503, b"loading")
                elif self.path == "/v1/models":
                    self._send(200, b'{"data": [{"id": "m"}]}', "application/json")
                else:
                    self._send(200, b"ok")
            elif self.path == "/metrics" and args.flavor != "none":
                self._send(200, METRICS[args.flavor].encode())
            elif self.path == "/flushes":
                self._send(200, str(flushes["n"]).encode())
            else:
                self._send(404, b"not found")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path == "/flush_cache":
                flushes["n"] += 1
                self._send(200, b"flushed")
            elif self.path == "/v1/chat/completions":
                req = json.loads(body or b"{}")
                answer = {
                    "id": "x",
                    "object": "chat.completion",
                    "model": req.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ready"},
                            "finish_reason": "stop",
                        }
                    ],
                }
                self._send(200, json.dumps(answer).encode(), "application/json")
            else:
                self._send(404, b"not found")

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"standin: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
