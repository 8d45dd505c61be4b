"""Benchmark: `keras-trm serve` under load over loopback (writes JSON).

    python bench/bench_serving.py [--model-base-path export/transformer_multi30k_en_de]
        [--requests 10000] [--clients 16] [--transport rest|grpc]
        [--swap-version] [--output bench/results/serving.json]

For each configuration (without batching, then with `--enable_batching`) a
server is started as its own process (`python -m keras_trm.cli serve` on
127.0.0.1), then:

1. idle latency: `--idle-requests` single-sentence requests one after
   another (p50/p95 in ms);
2. load: `--clients` threads, each with its own connection, send
   `--requests` requests of one Multi30k test sentence each
   (`test_2016_flickr`, cycled), as fast as answers come: sentences/s,
   latency p50/p95/p99, errors, server RSS before, during (min/max, sampled
   each second) and after;
3. with `--swap-version`, a third run (batching on) serves a copy of the
   export from a temporary folder; half-way through `--swap-requests`
   requests a new version is copied in (written beside, renamed into place)
   and the run checks that no request failed and that the new version ends
   up `AVAILABLE` and answering while the old one is `END`.

Requests go over REST (`:predict`, `requests` with keep-alive) or, with
`--transport grpc`, over gRPC (`PredictionService/Predict` through the
`tensorflow-serving-api` stubs). Last, without any server, the SavedModel
is called in process (`--decoder-ceiling-seconds`): `--clients` threads of
one-sentence calls against `--num-batch-threads` threads of
`--max-batch-size`-sentence calls, the most that batching can gain with
this model on this host.

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
        self.name = name
        # The translation signature's one input, from TF Serving's metadata.
        meta = requests.get(self.url + "/metadata", timeout=60).json()
        inputs = meta["metadata"]["signature_def"]["signature_def"][
            "serving_default"]["inputs"]
        (self.input_name,) = inputs

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


def rest_sender(server):
    """One client's REST connection: ``send(sentence) -> problem or None``."""
    session = requests.Session()

    def send(sentence):
        reply = session.post(server.url + ":predict", timeout=300,
                             json={"instances": [sentence]})
        if reply.status_code == 200 and len(reply.json()["predictions"]) == 1:
            return None
        return f"{reply.status_code}: {reply.text[:200]}"

    return send


def grpc_sender(server):
    """One client's gRPC channel: TF Serving's ``PredictionService/Predict``
    through the ``tensorflow-serving-api`` stubs."""
    import grpc
    from tensorflow.core.framework import tensor_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def send(sentence):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = server.name
        request.model_spec.signature_name = "serving_default"
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                        string_val=[sentence.encode("utf-8")])
        tensor.tensor_shape.dim.add(size=1)
        request.inputs[server.input_name].CopyFrom(tensor)
        try:
            reply = stub.Predict(request, timeout=300)
        except grpc.RpcError as err:
            return f"{err.code().name}: {err.details()[:200]}"
        outputs = list(reply.outputs.values())
        if len(outputs) == 1 and len(outputs[0].string_val) == 1:
            return None
        return f"unexpected reply: {str(reply)[:200]}"

    return send


SENDERS = {"rest": rest_sender, "grpc": grpc_sender}


def idle_latency(server, sentences, count, transport="rest"):
    send = SENDERS[transport](server)
    times = []
    for i in range(count + 3):
        start = time.perf_counter()
        problem = send(sentences[i % len(sentences)])
        if problem:
            raise RuntimeError(f"idle request failed: {problem}")
        if i >= 3:  # the first requests warm the graph up
            times.append(time.perf_counter() - start)
    return {"requests": count, **percentiles(times)}


def load(server, sentences, total, clients, time_limit, on_progress=None,
         transport="rest"):
    """`clients` threads send `total` one-sentence requests; returns figures."""
    lock = threading.Lock()
    state = {"next": 0, "done": 0}
    latencies, errors = [], []
    deadline = time.monotonic() + time_limit

    def client():
        send = SENDERS[transport](server)
        while True:
            with lock:
                i = state["next"]
                if i >= total or time.monotonic() > deadline:
                    return
                state["next"] += 1
            start = time.perf_counter()
            try:
                problem = send(sentences[i % len(sentences)])
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
        result["idle_latency"] = idle_latency(server, sentences, args.idle_requests,
                                              args.transport)
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
                              on_progress=maybe_swap if swap else None,
                              transport=args.transport)
        result["server_rss_mib_after"] = round(server.rss_mib(), 1)
        if swap:
            result["swap"] = check_swap(server, swap_info, sentences)
    finally:
        result["server_exit_code"] = server.stop()
        if batching_file:
            result["batches"] = server.batching_stats()
    print(f"[{label}] {json.dumps(result)[:600]}", flush=True)
    return result


def decoder_ceiling_child(args):
    """Runs in a child process: the export's SavedModel called directly, no
    server. ``clients`` threads each translating 1 sentence per call (what
    the server without batching can at best do) against
    ``num_batch_threads`` threads each translating ``max_batch_size``
    sentences per call (the server with batching, every batch full),
    alternated in rounds; prints sentences/s of each as JSON."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - the export's tokenizer ops

    from keras_trm.data import load_multi30k

    tf.config.threading.set_intra_op_parallelism_threads(
        args.tensorflow_intra_op_parallelism)
    tf.config.threading.set_inter_op_parallelism_threads(
        args.tensorflow_inter_op_parallelism)
    base_path = pathlib.Path(args.model_base_path)
    latest = max(int(p.name) for p in base_path.iterdir() if p.name.isdigit())
    translate = tf.saved_model.load(str(base_path / str(latest))).signatures[
        "serving_default"]
    sentences, _ = load_multi30k("test_2016_flickr", args.data_dir)
    for size in (1, args.max_batch_size):
        translate(tf.constant(sentences[:size]))  # warm-up
    lock = threading.Lock()

    def run(threads, rows, seconds):
        state = {"next": 0, "sentences": 0}
        stop = time.monotonic() + seconds

        def worker():
            while time.monotonic() < stop:
                with lock:
                    i = state["next"]
                    state["next"] = (i + rows) % (len(sentences) - rows)
                translate(tf.constant(sentences[i:i + rows]))
                with lock:
                    state["sentences"] += rows

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        start = time.perf_counter()
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        return state["sentences"], time.perf_counter() - start

    sides = {"one_sentence_calls": (args.clients, 1),
             "full_batch_calls": (args.num_batch_threads, args.max_batch_size)}
    totals = {k: [0, 0.0] for k in sides}
    for _ in range(2):  # rounds: A B A B, so both see the same load
        for key, (threads, rows) in sides.items():
            done, seconds = run(threads, rows, args.decoder_ceiling_seconds / 4)
            totals[key][0] += done
            totals[key][1] += seconds
    out = {key: {"threads": sides[key][0], "sentences_per_call": sides[key][1],
                 "sentences": n, "seconds": round(sec, 2),
                 "sentences_per_s": round(n / sec, 2)}
           for key, (n, sec) in totals.items()}
    out["full_batch_over_one_sentence"] = round(
        out["full_batch_calls"]["sentences_per_s"]
        / out["one_sentence_calls"]["sentences_per_s"], 2)
    print(json.dumps(out), flush=True)


def decoder_ceiling(args):
    """``decoder_ceiling_child`` in its own process (TensorFlow stays out of
    the benchmark's process); None when skipped."""
    if args.decoder_ceiling_seconds <= 0:
        return None
    cmd = [sys.executable, __file__, "--ceiling-child",
           "--model-base-path", str(args.model_base_path),
           "--clients", str(args.clients),
           "--max-batch-size", str(args.max_batch_size),
           "--num-batch-threads", str(args.num_batch_threads),
           "--tensorflow-intra-op-parallelism", str(args.tensorflow_intra_op_parallelism),
           "--tensorflow-inter-op-parallelism", str(args.tensorflow_inter_op_parallelism),
           "--decoder-ceiling-seconds", str(args.decoder_ceiling_seconds)]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    print(f"[decoder_ceiling] the SavedModel in process, {args.decoder_ceiling_seconds} s",
          flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=600 + 2 * args.decoder_ceiling_seconds)
    if proc.returncode:
        raise RuntimeError(f"decoder ceiling run failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"[decoder_ceiling] {json.dumps(result)}", flush=True)
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
    parser.add_argument("--transport", choices=sorted(SENDERS), default="rest",
                        help="REST (requests, keep-alive) or gRPC (the "
                        "tensorflow-serving-api stubs), one connection per client")
    parser.add_argument("--swap-version", action="store_true",
                        help="also run a version change under load (batching on)")
    parser.add_argument("--swap-requests", type=int, default=2000)
    parser.add_argument("--time-limit", type=float, default=3600.0,
                        help="seconds each load run may take at most")
    parser.add_argument("--decoder-ceiling-seconds", type=float, default=40.0,
                        help="also call the SavedModel in process, without a server, "
                        "for this long: the batching speedup's upper bound (0: skip)")
    parser.add_argument("--ceiling-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=str(ROOT / "bench/results/serving.json"))
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from keras_trm.data import load_multi30k

    if args.ceiling_child:
        decoder_ceiling_child(args)
        return

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
            "transport": {
                "rest": "REST over loopback (127.0.0.1), one HTTP keep-alive "
                        "connection per client thread",
                "grpc": "gRPC over loopback (127.0.0.1): PredictionService/Predict "
                        "with tensorflow-serving-api's stub, one channel per client "
                        "thread"}[args.transport],
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
    report["decoder_ceiling"] = decoder_ceiling(args)
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
