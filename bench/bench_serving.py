"""Benchmark: `keras-trm serve` under load over loopback (writes JSON).

    python bench/bench_serving.py [--model-base-path export/transformer_multi30k_en_de]
        [--requests 10000] [--clients 16] [--swap-version]
        [--output bench/results/serving.json]

For each configuration (without batching, then with `--enable_batching`) a
server is started as its own process (`python -m keras_trm.cli serve` on
127.0.0.1), then:

1. idle latency: `--idle-requests` single-sentence REST requests one after
   another (p50/p95 in ms);
2. load: `--clients` threads, each with its own HTTP connection, send
   `--requests` REST `:predict` requests of one Multi30k test sentence each
   (`test_2016_flickr`, cycled), as fast as answers come: sentences/s,
   latency p50/p95/p99, errors, server RSS before, during (min/max, sampled
   each second) and after;
3. with `--swap-version`, a third run (batching on) serves a copy of the
   export from a temporary folder; half-way through `--swap-requests`
   requests a new version is copied in (written beside, renamed into place)
   and the run checks that no request failed and that the new version ends
   up `AVAILABLE` and answering while the old one is `END`.

Every run is bounded by `--time-limit` seconds (requests not sent by then
are counted as `not_sent`), and each server is stopped with SIGTERM.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
import requests

ROOT = pathlib.Path(__file__).resolve().parents[1]


def host_info():
    """CPU model and flags from /proc/cpuinfo, core count, Python, platform."""
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count()}
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and "cpu_model" not in info:
                info["cpu_model"] = value.strip()
            elif key == "flags" and "cpu_flags" not in info:
                info["cpu_flags"] = value.split()
    except OSError:
        pass
    try:
        info["load_average_at_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`keras-trm serve` in a child process on 127.0.0.1."""

    def __init__(self, base_path, name, batching_file=None, poll_seconds=1.0,
                 log_path=None, start_timeout=600, threads=(0, 0)):
        self.rest, self.grpc = free_port(), free_port()
        cmd = [sys.executable, "-m", "keras_trm.cli", "serve",
               "--rest_api_port", str(self.rest), "--port", str(self.grpc),
               "--model_name", name, "--model_base_path", str(base_path),
               "--file_system_poll_wait_seconds", str(poll_seconds),
               "--rest_api_num_threads", "32",
               "--tensorflow_intra_op_parallelism", str(threads[0]),
               "--tensorflow_inter_op_parallelism", str(threads[1])]
        if batching_file:
            cmd += ["--enable_batching", "--batching_parameters_file", str(batching_file)]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        self.log_path = log_path
        self.log = open(log_path or os.devnull, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env)
        self.url = f"http://127.0.0.1:{self.rest}/v1/models/{name}"
        # The server prints one JSON line once it listens.
        timer = threading.Timer(start_timeout, self.proc.kill)
        timer.start()
        line = self.proc.stdout.readline()
        timer.cancel()
        if not line:
            raise RuntimeError(f"the server did not start (see {log_path})")
        self.started = json.loads(line)
        self.ps = psutil.Process(self.proc.pid)

    def rss_mib(self):
        return self.ps.memory_info().rss / 2**20

    def stop(self, timeout=120):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()
        return self.proc.returncode

    def batching_stats(self):
        """What the server logged about batching when it unloaded (after stop)."""
        if not self.log_path:
            return None
        found = re.findall(r"batching: (\d+) requests in (\d+) batches \(([\d.]+) rows",
                           pathlib.Path(self.log_path).read_text())
        return [{"requests": int(r), "batches": int(b), "rows_per_batch": float(m)}
                for r, b, m in found]


def percentiles(values_s):
    if not values_s:
        return {}
    ms = np.asarray(values_s) * 1000.0
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 1) for q in (50, 95, 99)}


def idle_latency(server, sentences, count):
    session = requests.Session()
    times = []
    for i in range(count + 3):
        start = time.perf_counter()
        reply = session.post(server.url + ":predict", timeout=120,
                             json={"instances": [sentences[i % len(sentences)]]})
        reply.raise_for_status()
        if i >= 3:  # the first requests warm the graph up
            times.append(time.perf_counter() - start)
    return {"requests": count, **percentiles(times)}


def load(server, sentences, total, clients, time_limit, on_progress=None):
    """`clients` threads send `total` one-sentence requests; returns figures."""
    lock = threading.Lock()
    state = {"next": 0, "done": 0}
    latencies, errors = [], []
    deadline = time.monotonic() + time_limit

    def client():
        session = requests.Session()
        while True:
            with lock:
                i = state["next"]
                if i >= total or time.monotonic() > deadline:
                    return
                state["next"] += 1
            start = time.perf_counter()
            try:
                reply = session.post(server.url + ":predict", timeout=300,
                                     json={"instances": [sentences[i % len(sentences)]]})
                ok = reply.status_code == 200 and len(reply.json()["predictions"]) == 1
                problem = None if ok else f"{reply.status_code}: {reply.text[:200]}"
            except Exception as err:  # noqa: BLE001 - counted as an error
                problem = f"{type(err).__name__}: {err}"
            with lock:
                state["done"] += 1
                if problem:
                    errors.append(problem)
                else:
                    latencies.append(time.perf_counter() - start)
                done = state["done"]
            if on_progress is not None:
                on_progress(done)

    rss = [server.rss_mib()]
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        threads[0].join(1.0) if threads[0].is_alive() else time.sleep(1.0)
        rss.append(server.rss_mib())
    elapsed = time.perf_counter() - start
    # Memory over the run: RSS at each quarter of the samples (taken each
    # second); stable means the later quarters stop growing.
    quarters = [round(rss[min(len(rss) - 1, (len(rss) * q) // 4)], 1) for q in (1, 2, 3, 4)]
    return {
        "requests": total, "clients": clients, "completed": state["done"],
        "not_sent": total - state["next"], "errors": len(errors),
        "error_examples": errors[:5], "seconds": round(elapsed, 2),
        "sentences_per_s": round(len(latencies) / elapsed, 2),
        **percentiles(latencies),
        "server_rss_mib_during": {"min": round(min(rss), 1), "max": round(max(rss), 1),
                                  "at_quarters": quarters,
                                  "growth_second_half": round(rss[-1] - rss[len(rss) // 2], 1)},
    }


def run_config(label, base_path, name, sentences, args, batching_file=None,
               swap=False, log_dir=None):
    print(f"[{label}] starting the server", flush=True)
    server = Server(base_path, name, batching_file, poll_seconds=1.0,
                    log_path=log_dir / f"server_{label}.log",
                    threads=(args.tensorflow_intra_op_parallelism,
                             args.tensorflow_inter_op_parallelism))
    result = {"batching": bool(batching_file),
              "tensorflow_threads": server.started.get("tensorflow_threads")}
    try:
        result["idle_latency"] = idle_latency(server, sentences, args.idle_requests)
        result["server_rss_mib_before"] = round(server.rss_mib(), 1)
        total = args.swap_requests if swap else args.requests
        swap_info = {}

        def maybe_swap(done):
            if swap and not swap_info and done >= total // 2:
                swap_info["at_request"] = done
                swap_info["new_version"] = add_version(base_path)
                swap_info["time"] = time.perf_counter()

        print(f"[{label}] {total} requests from {args.clients} clients", flush=True)
        result["load"] = load(server, sentences, total, args.clients, args.time_limit,
                              on_progress=maybe_swap if swap else None)
        result["server_rss_mib_after"] = round(server.rss_mib(), 1)
        if swap:
            result["swap"] = check_swap(server, swap_info, sentences)
    finally:
        result["server_exit_code"] = server.stop()
        if batching_file:
            result["batches"] = server.batching_stats()
    print(f"[{label}] {json.dumps(result)[:600]}", flush=True)
    return result


def add_version(base_path):
    """Copies the newest version as newest + 1 (copied beside, then renamed)."""
    base_path = pathlib.Path(base_path)
    versions = sorted(int(p.name) for p in base_path.iterdir() if p.name.isdigit())
    new = versions[-1] + 1
    tmp = base_path / f".tmp-bench-{new}"
    shutil.copytree(base_path / str(versions[-1]), tmp)
    os.rename(tmp, base_path / str(new))
    return new


def check_swap(server, info, sentences, timeout=300):
    """Waits for the new version to be AVAILABLE and the old one END."""
    if not info:
        return {"ok": False, "reason": "the run ended before the swap point"}
    new = info["new_version"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = requests.get(server.url, timeout=60).json()["model_version_status"]
        states = {int(s["version"]): s["state"] for s in status}
        if states.get(new) == "AVAILABLE" and all(
                state == "END" for v, state in states.items() if v != new):
            break
        time.sleep(0.5)
    served = requests.post(f"{server.url}/versions/{new}:predict", timeout=120,
                           json={"instances": [sentences[0]]})
    return {"new_version": new, "at_request": info["at_request"],
            "states_after": states, "new_version_answers": served.status_code == 200,
            "ok": states.get(new) == "AVAILABLE" and served.status_code == 200}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-base-path", default="export/transformer_multi30k_en_de")
    parser.add_argument("--model-name", default=None,
                        help="name in the URLs (default: the folder's name)")
    parser.add_argument("--data-dir", default=None,
                        help="data folder (else $KERAS_TRM_DATA_DIR)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--idle-requests", type=int, default=50)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-timeout-micros", type=int, default=10_000)
    parser.add_argument("--num-batch-threads", type=int, default=2)
    parser.add_argument("--tensorflow-intra-op-parallelism", type=int, default=1,
                        help="the server's flag (0: TensorFlow's default, one "
                        "thread per core)")
    parser.add_argument("--tensorflow-inter-op-parallelism", type=int, default=0)
    parser.add_argument("--swap-version", action="store_true",
                        help="also run a version change under load (batching on)")
    parser.add_argument("--swap-requests", type=int, default=2000)
    parser.add_argument("--time-limit", type=float, default=3600.0,
                        help="seconds each load run may take at most")
    parser.add_argument("--output", default=str(ROOT / "bench/results/serving.json"))
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from keras_trm.data import load_multi30k

    base_path = pathlib.Path(args.model_base_path).resolve()
    name = args.model_name or base_path.name
    sentences, _ = load_multi30k("test_2016_flickr", args.data_dir)
    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_serving_") as tmp:
        tmp = pathlib.Path(tmp)
        batching_file = tmp / "batching.txt"
        batching_file.write_text(
            f"max_batch_size {{ value: {args.max_batch_size} }}\n"
            f"batch_timeout_micros {{ value: {args.batch_timeout_micros} }}\n"
            f"num_batch_threads {{ value: {args.num_batch_threads} }}\n"
            "max_enqueued_batches { value: 1000 }\n")
        report = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": host_info(),
            "model_base_path": str(base_path),
            "versions": sorted(p.name for p in base_path.iterdir() if p.name.isdigit()),
            "sentences": "Multi30k test_2016_flickr (English), 1 per request, cycled",
            "transport": "REST over loopback (127.0.0.1), one HTTP keep-alive "
                         "connection per client thread",
            "batching_parameters": batching_file.read_text(),
            "server_flags": {
                "tensorflow_intra_op_parallelism": args.tensorflow_intra_op_parallelism,
                "tensorflow_inter_op_parallelism": args.tensorflow_inter_op_parallelism},
            "configs": {},
        }
        report["configs"]["no_batching"] = run_config(
            "no_batching", base_path, name, sentences, args, log_dir=tmp)
        report["configs"]["batching"] = run_config(
            "batching", base_path, name, sentences, args, batching_file, log_dir=tmp)
        if args.swap_version:
            copy = tmp / "models" / name
            latest = max(int(p.name) for p in base_path.iterdir() if p.name.isdigit())
            shutil.copytree(base_path / str(latest), copy / str(latest))
            report["configs"]["batching_version_swap"] = run_config(
                "batching_version_swap", copy, name, sentences, args, batching_file,
                swap=True, log_dir=tmp)
    configs = report["configs"]
    plain = configs["no_batching"]["load"]["sentences_per_s"]
    batched = configs["batching"]["load"]["sentences_per_s"]
    report["batching_speedup"] = round(batched / plain, 2) if plain else None
    report["targets"] = {
        "batching_speedup_at_least_3x": bool(plain) and batched >= 3 * plain,
        "idle_p50_at_most_100_ms": min(
            c["idle_latency"]["p50_ms"] for c in configs.values()) <= 100,
        "zero_errors": all(c["load"]["errors"] == 0 for c in configs.values()),
        # Memory stable: no more than 50 MiB added over the second half of
        # each fixed-model run (the swap run loads a second version).
        "rss_stable_second_half_at_most_50_mib": all(
            configs[k]["load"]["server_rss_mib_during"]["growth_second_half"] <= 50
            for k in ("no_batching", "batching")),
    }
    if args.swap_version:
        report["targets"]["version_swap_ok"] = bool(
            configs["batching_version_swap"]["swap"]["ok"]
            and configs["batching_version_swap"]["load"]["errors"] == 0)
    from keras_trm.utils import write_json

    write_json(output, report)
    print(json.dumps({k: report[k] for k in ("batching_speedup", "targets")}, indent=1))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
