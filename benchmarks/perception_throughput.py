"""Throughput of the ``openai`` backend against an endpoint with a fixed per-call latency.

Starts an OpenAI-compatible server on 127.0.0.1 in a child process (stdlib, one thread
per connection) that answers every chat completion after ``--latency-ms``, then sends
calls through ``OpenAIBackend`` at concurrency 1, 2, 4, ... and compares each rate with
the sequential one (concurrency 1) measured in the same process. The target: at
concurrency N, at least 0.8 x N times the sequential rate.

With ``--servers 1,2,4`` it starts that many such servers instead and sends the calls
through one backend with ``base_urls``, ``--concurrency`` calls in flight per server,
each count of servers compared with one server; the target is again 0.8 x the count.

With ``--against CHECKOUT`` each level is measured in fresh processes, alternately with this
checkout's code and another's (an older commit), against the same servers, ``--repeats``
times each; it prints both rates and their ratio, the target being ``--min-ratio``.

    python benchmarks/perception_throughput.py                 # text calls, 100 ms
    python benchmarks/perception_throughput.py --images 2      # two key frames per call
    python benchmarks/perception_throughput.py --servers 1,2,4 --concurrency 8 --images 2
    python benchmarks/perception_throughput.py --latency-ms 1000 --levels 32,128 --against ../main
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPLY = json.dumps({"action": "move forward", "new_info": "a corridor", "question_info": "none"})


def serve(port: int, latency_s: float) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes; with Nagle's algorithm the body
        # would wait for the client's delayed ACK (~40 ms) and pad every call.
        disable_nagle_algorithm = True

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"status": "ok"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency_s)
            self._send({
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": REPLY}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
            })

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # Bursts of new connections at high concurrency; read by listen() when the server binds.
        request_queue_size = 1024

    Server(("127.0.0.1", port), Handler).serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(latency_s: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--latency-ms", str(latency_s * 1000)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the latency server did not start")


def conversations(n: int, images: int, folder: Path) -> list:
    """``n`` calls; with images, call i shows key frames i (and i + 1), as perception of
    one question would, so each frame is encoded once and sent once or twice."""
    from embodied_r.perception import prompts

    if not images:
        return [[{"role": "user", "content": f"Describe frame {i}."}] for i in range(n)]
    import numpy as np
    from PIL import Image

    paths = []
    ramp = np.linspace(0, 255, 640, dtype=np.float32)
    for i in range(n + 1):
        path = folder / f"{i:05d}.jpg"
        if not path.exists():
            # Smooth gradients with a moving bar: JPEG sizes like real frames, unlike noise.
            img = np.empty((360, 640, 3), dtype=np.uint8)
            img[..., 0] = np.roll(ramp, 7 * i)[None, :]
            img[..., 1] = np.linspace(0, 255, 360, dtype=np.float32)[:, None]
            img[..., 2] = 128
            img[:, (13 * i) % 600 : (13 * i) % 600 + 40] = 255
            Image.fromarray(img).save(path, quality=90)
        paths.append(str(path))
    if images == 1:
        return [prompts.first_frame_conversation(paths[i], f"Q{i}") for i in range(n)]
    return [prompts.pair_conversation(paths[i], paths[i + 1], f"Q{i}") for i in range(n)]


def measure(base_urls: list[str], concurrency: int, calls: int, images: int, folder: Path,
            repeats: int) -> tuple[float, float]:
    """(calls per second, client CPU milliseconds per call) at this concurrency: the best
    of ``repeats`` runs, after a warm-up that opens the connections. The best run is the
    one least disturbed by other load on the machine."""
    from embodied_r.backends.images import IMAGES
    from embodied_r.backends.openai_compat import OpenAIBackend
    from embodied_r.backends.base import BackendConfig

    cfg = BackendConfig(kind="openai", model="bench", base_urls=base_urls, concurrency=concurrency,
                        max_retries=0, timeout_s=30, api_key_env="EMBODIED_R_BENCH_NO_KEY")
    backend = OpenAIBackend(cfg)
    best = (0.0, 0.0)
    try:
        backend.generate(conversations(concurrency * len(base_urls), images, folder))
        convs = conversations(calls, images, folder)
        for _ in range(repeats):
            IMAGES.clear()  # every run encodes each frame once
            cpu, start = time.process_time(), time.perf_counter()
            out = backend.generate(convs)
            rate = calls / (time.perf_counter() - start)
            errors = [g.error for g in out if g.error]
            if errors:
                raise RuntimeError(f"{len(errors)} calls failed, e.g. {errors[0]}")
            if rate > best[0]:
                best = (rate, (time.process_time() - cpu) / calls * 1000)
    finally:
        backend.close()
    return best


def measure_in(checkout: Path, base_urls: list[str], concurrency: int, calls: int, images: int,
               folder: Path) -> tuple[float, float]:
    """``measure`` once, in a fresh process that imports the library from ``checkout``."""
    job = json.dumps({"urls": base_urls, "concurrency": concurrency, "calls": calls, "images": images,
                      "folder": str(folder)})
    out = subprocess.run([sys.executable, __file__, "--measure", job], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(checkout)}).stdout
    rate, cpu_ms = json.loads(out.splitlines()[-1])
    return rate, cpu_ms


def compare(args: argparse.Namespace, levels: list[int], urls: list[str], folder: Path) -> int:
    """Each level measured ``--repeats`` times with each checkout, alternating which goes
    first, so that load from other work on the machine falls on both alike."""
    other = Path(args.against).resolve()
    rows = []
    for n in levels:
        calls = max(20, args.rounds * n)
        runs: dict[Path, list[tuple[float, float]]] = {ROOT: [], other: []}
        for r in range(args.repeats):
            for checkout in (ROOT, other) if r % 2 == 0 else (other, ROOT):
                runs[checkout].append(measure_in(checkout, urls, n, calls, args.images, folder))
        ratios = [a[0] / b[0] for a, b in zip(runs[ROOT], runs[other])]
        rows.append((n, calls, [r for r, _ in runs[ROOT]], [r for r, _ in runs[other]], ratios,
                     statistics.median(c for _, c in runs[ROOT]), statistics.median(c for _, c in runs[other])))
    print(f"latency {args.latency_ms:.0f} ms per call, {args.images} image(s) per call, {args.repeats} runs each, "
          f"interleaved; this checkout ({ROOT}) against {other}")
    print(f"{'concurrency':>11} {'calls':>6} {'calls/s this':>15} {'calls/s other':>15} {'ratio':>17} "
          f"{'target':>7} {'cpu ms/call':>12}  ok")
    missed = 0
    for n, calls, mine, theirs, ratios, cpu_mine, cpu_theirs in rows:
        ok = statistics.median(ratios) >= args.min_ratio
        missed += not ok
        print(f"{n:>11} {calls:>6} {min(mine):>7.1f}-{max(mine):<7.1f} {min(theirs):>7.1f}-{max(theirs):<7.1f} "
              f"{statistics.median(ratios):>5.3f}x ({min(ratios):.2f}-{max(ratios):.2f}) {args.min_ratio:>6.2f}x "
              f"{cpu_mine:>5.2f} / {cpu_theirs:<5.2f}  {'yes' if ok else 'NO'}")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--levels", default="1,2,4,8,16,32")
    parser.add_argument("--rounds", type=int, default=8, help="calls per level = rounds x concurrency (min 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per level; the best counts")
    parser.add_argument("--images", type=int, default=0, choices=[0, 1, 2], help="key frames per call")
    parser.add_argument("--servers", help="counts of servers to compare, e.g. 1,2,4 (instead of --levels)")
    parser.add_argument("--concurrency", type=int, default=8, help="with --servers: calls in flight per server")
    parser.add_argument("--against", help="another checkout of the project: each level's rate with this "
                                          "checkout's code over that one's (runs per level: --repeats each)")
    parser.add_argument("--min-ratio", type=float, default=0.95, help="with --against: the target ratio")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.latency_ms / 1000)
        return 0
    if args.measure:
        job = json.loads(args.measure)
        print(json.dumps(measure(job["urls"], job["concurrency"], job["calls"], job["images"], Path(job["folder"]), 1)))
        return 0
    if args.against and args.servers:
        parser.error("--against compares levels of concurrency on one server; leave out --servers")

    by_servers = args.servers is not None
    levels = [int(x) for x in (args.servers if by_servers else args.levels).split(",")]
    procs, urls = [], []
    rows = []
    try:
        for _ in range(max(levels) if by_servers else 1):
            proc, url = start_server(args.latency_ms / 1000)
            procs.append(proc)
            urls.append(url)
        with tempfile.TemporaryDirectory() as tmp:
            if args.against:
                return compare(args, levels, urls, Path(tmp))
            baseline = None
            for n in levels:
                # n servers at a fixed concurrency each, or one server at concurrency n.
                servers, concurrency = (urls[:n], args.concurrency) if by_servers else (urls, n)
                calls = max(20, args.rounds * concurrency * len(servers))
                rate, cpu_ms = measure(servers, concurrency, calls, args.images, Path(tmp), args.repeats)
                baseline = baseline or rate  # the first level is the baseline
                rows.append((n, calls, rate, rate / baseline, cpu_ms))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()

    level = "servers" if by_servers else "concurrency"
    per = f", {args.concurrency} calls in flight per server" if by_servers else ""
    print(f"latency {args.latency_ms:.0f} ms per call, {args.images} image(s) per call{per}, "
          f"best of {args.repeats} runs, baseline {level} {levels[0]}")
    print(f"{level:>11} {'calls':>6} {'calls/s':>8} {'speed-up':>9} {'target':>7} {'cpu ms/call':>12}  ok")
    missed = 0
    for n, calls, rate, speedup, cpu_ms in rows:
        target = 0.8 * n / levels[0]
        ok = speedup >= target
        missed += not ok
        print(f"{n:>11} {calls:>6} {rate:>8.1f} {speedup:>8.2f}x {target:>6.1f}x {cpu_ms:>12.2f}  {'yes' if ok else 'NO'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
