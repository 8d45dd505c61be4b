"""Benchmark: request latency and server memory across version swaps.

    python bench/bench_version_swap.py [--clients 16] [--swaps 10]
        [--modes old,new] [--output bench/results/version_swap.json]

Builds (once, cached under ``--work-dir``, never in the repository) an
untrained translation export of the Multi30k job's size: vocabulary 8000
(WordPiece tokens of Multi30k's train split), 3 layers, d_model 256,
d_ff 1024, beam 4; the weights do not matter to load and first-call
costs. For each mode a server is started as its own process (this
script with ``--serve-child``: ``ModelManager`` + ``ModelServer`` on
127.0.0.1, intra-op 1, 32 REST threads, polling every second, no
batching unless ``--batching``), serving a fresh copy of the export as
version 1. Then:

1. ``--clients`` threads, each with its own keep-alive connection, send
   one Multi30k test sentence per REST ``:predict`` (timeout
   ``--request-timeout`` s), as fast as answers come;
2. after ``--steady-seconds``, ``--swaps`` times: the newest version is
   copied as newest + 1 (copied beside, renamed into place), the script
   waits until the new version is ``AVAILABLE`` and the old one ``END``
   (the swap window), then ``--settle-seconds``, reads the server's RSS,
   and lets ``--steady-seconds`` pass before the next swap;
3. latency percentiles (p50/p99/max) of the requests that overlap a swap
   window and of the others (steady), timeouts and errors; the server's
   per-version load timings from its log; the longest the server's
   Python threads waited for the interpreter (a 5 ms heartbeat thread in
   the server process: its largest gap, steady vs during swaps); and,
   after each swap, what the server's memory holds (``memory_monitor``:
   RSS anonymous / file-backed, glibc malloc's bytes in use and kept
   free, TensorFlow's registered functions, Python objects), which tells
   live memory from allocator retention;
4. with the clients stopped, the refusals of issue #38: a gRPC Predict
   whose TensorProto declares shape [200000] with one string value, and
   a REST body of 1,000,000 tiny (empty-string) instances: response
   time, status, and server RSS before / peak during (sampled every
   5 ms) / after.

Modes: ``old`` is the server as it was before issue #38 item 3
(``ModelManager(warm_up_signatures=False, loader_niceness=0,
release_memory=False)``): a new version is ``AVAILABLE`` right after
``tf.saved_model.load`` (and the warm-up file, if any), so every client's
first request instantiates the signature's function concurrently; and
the unloaded version's memory is left to the next garbage collection.
``new`` is the default server (``loader_niceness=10``);
``new_niceness_0`` the same with the warm-up calls at normal priority.
The ``signature_defs`` copies (an ``END`` version no longer keeps its
parsed ``saved_model.pb``) apply to every mode.
"""

import argparse
import collections
import datetime
import gzip
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

MODEL = dict(vocabulary_size=8000, num_layers=3, d_model=256, num_heads=4, d_ff=1024,
             max_length=128, beam_size=4)
MODES = {
    "old": dict(warm_up_signatures=False, loader_niceness=0, release_memory=False),
    "new": dict(),
    "new_niceness_0": dict(loader_niceness=0),
}


def host_info():
    from bench_serving import host_info as info

    host = info()
    host.pop("cpu_flags", None)
    return host


def data_dir():
    return pathlib.Path(os.environ.get("KERAS_TRM_DATA_DIR", ROOT / "data"))


# -- the export -----------------------------------------------------------------------
def multi30k_vocabulary(size):
    """Reserved tokens, characters, ``##`` characters, then Multi30k's most
    frequent words (train split, both languages) up to ``size`` tokens."""
    from keras_trm.text import RESERVED_TOKENS

    counts = collections.Counter()
    for lang in ("en", "de"):
        with gzip.open(data_dir() / "multi30k" / f"train.{lang}.gz", "rt",
                       encoding="utf-8") as f:
            for line in f:
                counts.update(re.findall(r"\w+|[^\w\s]", line))
    chars = sorted({c for w in counts for c in w})
    vocab = list(RESERVED_TOKENS) + chars + [f"##{c}" for c in chars]
    vocab += [w for w, _ in counts.most_common() if len(w) > 1][: size - len(vocab)]
    return vocab


def build_export(work_dir):
    """The untrained translator export (cached by its configuration)."""
    key = hashlib.sha1(json.dumps(MODEL, sort_keys=True).encode()).hexdigest()[:10]
    root = pathlib.Path(work_dir) / f"export-{key}"
    path = root / "translator" / "1"
    if (path / "saved_model.pb").is_file():
        return path
    import keras

    import keras_trm  # noqa: F401  (checks the backend)
    from keras_trm.decoding import Translator
    from keras_trm.export import export_module
    from keras_trm.models import transformer
    from keras_trm.text import TextTokenizer

    keras.utils.set_random_seed(0)
    vocab = multi30k_vocabulary(MODEL["vocabulary_size"])
    model = transformer(len(vocab), num_layers=MODEL["num_layers"],
                        d_model=MODEL["d_model"], num_heads=MODEL["num_heads"],
                        d_ff=MODEL["d_ff"], max_sequence_length=MODEL["max_length"])
    translator = Translator(model, TextTokenizer(vocab), beam_size=MODEL["beam_size"])
    if root.exists():
        shutil.rmtree(root)
    return export_module(translator, root, "translator",
                         {"serving_default": translator.translate}, version=1)


def test_sentences():
    with gzip.open(data_dir() / "multi30k" / "test_2016_flickr.en.gz", "rt",
                   encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def dir_size_mib(path):
    return sum(p.stat().st_size for p in pathlib.Path(path).rglob("*") if p.is_file()) / 2**20


# -- the server process ---------------------------------------------------------------
def serve_child(args):
    """Runs in the child: the server, plus a heartbeat thread that records
    (wall time, gap) whenever a 5 ms sleep took over 20 ms."""
    from keras_trm.serving import (
        BatchingOptions, ModelManager, ModelServer, configure_tensorflow_threads,
        model_server_config)

    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    threads = configure_tensorflow_threads(args.intra_op, 0)
    heartbeat = open(args.heartbeat_file, "w", buffering=1)

    def beat():
        last = time.perf_counter()
        while True:
            time.sleep(0.005)
            now = time.perf_counter()
            if now - last > 0.02:
                heartbeat.write(f"{time.time():.3f} {now - last:.3f}\n")
            last = now

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    threading.Thread(target=memory_monitor, args=(args.heartbeat_file + ".memory",),
                     name="memory", daemon=True).start()
    options = MODES[args.mode]
    batching = (BatchingOptions(max_batch_size=8, batch_timeout_micros=10_000,
                                num_batch_threads=2, max_enqueued_batches=1000)
                if args.batching else None)
    manager = ModelManager(model_server_config(["translator"], [args.serve_child]),
                           batching, file_system_poll_wait_seconds=1.0, **options)
    server = ModelServer(manager, rest_api_port=0, grpc_port=0, rest_api_num_threads=32,
                         grpc_max_threads=32)
    server.serve_forever(grace=10, info={"tensorflow_threads": threads},
                         exit_after_grace=True)


def memory_monitor(path, every=1.0):
    """Runs in the server: each second, one JSON line of what its memory
    holds: RSS (anonymous / file-backed), glibc malloc's bytes in use and
    free-but-kept (``mallinfo2``, all arenas), TensorFlow's registered
    functions and Python's live objects (counted every 10th line)."""
    import ctypes
    import gc

    from tensorflow.python.eager import context

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
        mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        mallinfo2 = None
    out = open(path, "w", buffering=1)
    objects, n = None, 0
    while True:
        status = {line.split(":")[0]: int(line.split()[1]) for line in
                  open("/proc/self/status") if line.startswith(("RssAnon", "RssFile"))}
        record = {"time": round(time.time(), 3),
                  "rss_anon_mib": round(status.get("RssAnon", 0) / 1024, 1),
                  "rss_file_mib": round(status.get("RssFile", 0) / 1024, 1),
                  "tf_functions": len(context.context().list_function_names())}
        if mallinfo2 is not None:
            info = mallinfo2()
            record.update(malloc_in_use_mib=round(info.uordblks / 2**20, 1),
                          malloc_free_kept_mib=round(info.fordblks / 2**20, 1),
                          malloc_mmapped_mib=round(info.hblkhd / 2**20, 1))
        if n % 10 == 0:
            objects = len(gc.get_objects())
        record["python_objects"] = objects
        n += 1
        out.write(json.dumps(record) + "\n")
        time.sleep(every)


def last_memory_record(path):
    try:
        lines = open(path).read().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


class Server:
    def __init__(self, base_path, mode, args, log_path, heartbeat_path):
        cmd = [sys.executable, __file__, "--serve-child", str(base_path), "--mode", mode,
               "--intra-op", str(args.intra_op), "--heartbeat-file", str(heartbeat_path)]
        if args.batching:
            cmd.append("--batching")
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env)
        timer = threading.Timer(600, self.proc.kill)
        timer.start()
        line = self.proc.stdout.readline()
        timer.cancel()
        if not line:
            raise RuntimeError(f"the server did not start (see {log_path})")
        self.info = json.loads(line)
        self.url = f"http://127.0.0.1:{self.info['rest_api_port']}/v1/models/translator"
        import psutil

        self.ps = psutil.Process(self.proc.pid)

    def rss_mib(self):
        return self.ps.memory_info().rss / 2**20

    def states(self):
        import requests

        status = requests.get(self.url, timeout=60).json()["model_version_status"]
        return {int(s["version"]): s["state"] for s in status}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def add_version(base_path):
    """Copies the newest version as newest + 1 (copied beside, renamed)."""
    versions = sorted(int(p.name) for p in base_path.iterdir() if p.name.isdigit())
    new = versions[-1] + 1
    tmp = base_path / f".tmp-{new}"
    shutil.copytree(base_path / str(versions[-1]), tmp)
    os.rename(tmp, base_path / str(new))
    return new


# -- measurements ---------------------------------------------------------------------
def percentiles(values):
    import numpy as np

    if not values:
        return {"count": 0}
    ms = 1000 * np.asarray(values)
    return {"count": len(values), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "max_ms": round(float(ms.max()), 1)}


class Clients:
    """``n`` threads sending one sentence per REST request until stopped."""

    def __init__(self, url, sentences, n, timeout):
        self.records = []  # (start wall time, end wall time, outcome)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(url, sentences, i, n,
                                                                 timeout), daemon=True)
                        for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _run(self, url, sentences, i, n, timeout):
        import requests

        session = requests.Session()
        k = i
        while not self.stop_event.is_set():
            body = {"instances": [sentences[k % len(sentences)]]}
            k += n
            start = time.time()
            try:
                reply = session.post(url + ":predict", json=body, timeout=timeout)
                outcome = "ok" if reply.status_code == 200 else f"http_{reply.status_code}"
            except requests.Timeout:
                outcome = "timeout"
                session = requests.Session()
            except requests.RequestException as err:
                outcome = type(err).__name__
                session = requests.Session()
            with self.lock:
                self.records.append((start, time.time(), outcome))

    def stop(self, timeout):
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout)


def summarize(records, windows, heartbeat):
    def overlaps(start, end):
        return any(start < w_end and end > w_start for w_start, w_end in windows)

    groups = {"steady": [], "during_swaps": []}
    outcomes = {"steady": collections.Counter(), "during_swaps": collections.Counter()}
    for start, end, outcome in records:
        group = "during_swaps" if overlaps(start, end) else "steady"
        outcomes[group][outcome] += 1
        if outcome == "ok":
            groups[group].append(end - start)
    result = {}
    for group, values in groups.items():
        result[group] = {**percentiles(values), "outcomes": dict(outcomes[group]),
                         "timeouts": outcomes[group].get("timeout", 0),
                         "errors": sum(c for o, c in outcomes[group].items()
                                       if o not in ("ok", "timeout"))}
        gaps = [gap for t, gap in heartbeat
                if (group == "during_swaps") == overlaps(t - gap, t)]
        result[group]["server_heartbeat_max_gap_ms"] = round(1000 * max(gaps, default=0), 1)
    return result


def read_heartbeat(path):
    try:
        return [tuple(map(float, line.split())) for line in open(path) if line.strip()]
    except OSError:
        return []


def load_timings(log_path):
    """The server log's per-version load lines."""
    pattern = re.compile(r"version (\d+) AVAILABLE \((.*)\)")
    out = []
    for line in open(log_path, encoding="utf-8", errors="replace"):
        match = pattern.search(line)
        if match:
            out.append({"version": int(match.group(1)), "log": match.group(2)})
    return out


def refusals(server):
    """The two request bombs of issue #38, with the clients stopped."""
    import grpc
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    def sampled(send):
        peak = [server.rss_mib()]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak.append(server.rss_mib())
                time.sleep(0.005)

        before = server.rss_mib()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        answer = send()
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
        time.sleep(0.5)
        return {**answer, "response_ms": round(1000 * seconds, 1),
                "server_rss_mib_before": round(before, 1),
                "server_rss_mib_peak_during": round(max(peak), 1),
                "server_rss_mib_after": round(server.rss_mib(), 1)}

    proto = tf.make_tensor_proto(["a"])
    del proto.tensor_shape.dim[:]
    proto.tensor_shape.dim.add(size=200_000)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "translator"
    request.inputs["sentences"].CopyFrom(proto)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.info['grpc_port']}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def grpc_bomb():
        try:
            stub.Predict(request, timeout=60)
            return {"status": "OK"}
        except grpc.RpcError as err:
            return {"status": err.code().name, "message": err.details()[:200]}

    body = json.dumps({"instances": [""] * 1_000_000}).encode()

    def rest_bomb():
        reply = requests.post(server.url + ":predict", data=body, timeout=60)
        return {"status": reply.status_code, "message": reply.text[:200]}

    result = {"grpc_shape_200000_one_value": {
                  "request_bytes": request.ByteSize(), **sampled(grpc_bomb)},
              "rest_1000000_empty_instances": {
                  "request_bytes": len(body), **sampled(rest_bomb)}}
    channel.close()
    return result


def run_mode(mode, export, sentences, args, work_dir):
    base = work_dir / f"base-{mode}" / "translator"
    if base.parent.exists():
        shutil.rmtree(base.parent)
    base.mkdir(parents=True)
    shutil.copytree(export, base / "1")
    log_path = work_dir / f"server-{mode}.log"
    heartbeat_path = work_dir / f"heartbeat-{mode}.txt"
    print(f"[{mode}] starting the server", flush=True)
    server = Server(base, mode, args, log_path, heartbeat_path)
    result = {"server_options": MODES[mode], "server_log": str(log_path)}
    clients = None
    try:
        result["server_rss_mib_loaded"] = round(server.rss_mib(), 1)
        # One request alone first: version 1's first call is not what is
        # measured here (the old server pays it on that request).
        import requests

        start = time.perf_counter()
        requests.post(server.url + ":predict", json={"instances": [sentences[0]]},
                      timeout=600).raise_for_status()
        result["first_request_alone_ms"] = round(1000 * (time.perf_counter() - start), 1)
        clients = Clients(server.url, sentences, args.clients, args.request_timeout)
        time.sleep(args.steady_seconds)
        result["server_rss_mib_before_swaps"] = round(server.rss_mib(), 1)
        windows, swaps = [], []
        for k in range(args.swaps):
            rss_before = server.rss_mib()
            start = time.time()
            new = add_version(base)
            deadline = time.monotonic() + args.swap_timeout
            while True:
                states = server.states()
                if states.get(new) == "AVAILABLE" and all(
                        s == "END" for v, s in states.items() if v != new):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"swap to version {new} not done: {states}")
                time.sleep(0.2)
            end = time.time()
            windows.append((start, end))
            time.sleep(args.settle_seconds)
            swap = {"swap": k + 1, "version": new, "swap_seconds": round(end - start, 2),
                    "server_rss_mib_before": round(rss_before, 1),
                    "server_rss_mib_after": round(server.rss_mib(), 1),
                    "server_memory_after": {
                        k: v for k, v in last_memory_record(
                            str(heartbeat_path) + ".memory").items() if k != "time"}}
            swaps.append(swap)
            print(f"[{mode}] {json.dumps(swap)}", flush=True)
            time.sleep(max(args.steady_seconds - args.settle_seconds, 0))
        clients.stop(args.request_timeout + 5)
        heartbeat = read_heartbeat(heartbeat_path)
        result["latency"] = summarize(clients.records, windows, heartbeat)
        result["swaps"] = swaps
        result["server_rss_mib_after_swap"] = [s["server_rss_mib_after"] for s in swaps]
        result["refusals"] = refusals(server)
    finally:
        if clients is not None:
            clients.stop(1)
        result["server_exit_code"] = server.stop()
        result["loads"] = load_timings(log_path)
    print(f"[{mode}] {json.dumps(result['latency'])}", flush=True)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--swaps", type=int, default=10)
    p.add_argument("--modes", default="old,new",
                   help="comma-separated, run in this order: old, new, new_niceness_0")
    p.add_argument("--steady-seconds", type=float, default=15.0,
                   help="before the first swap and between swaps")
    p.add_argument("--settle-seconds", type=float, default=3.0,
                   help="after a swap, before reading the RSS")
    p.add_argument("--request-timeout", type=float, default=60.0)
    p.add_argument("--swap-timeout", type=float, default=600.0)
    p.add_argument("--intra-op", type=int, default=1)
    p.add_argument("--batching", action="store_true")
    p.add_argument("--work-dir", default="/tmp/keras_trm_bench_version_swap")
    p.add_argument("--output", default=str(ROOT / "bench/results/version_swap.json"))
    p.add_argument("--serve-child", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="new", help=argparse.SUPPRESS)
    p.add_argument("--heartbeat-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_child:
        return serve_child(args)
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            p.error(f"--modes: unknown mode {mode!r}; choose from {sorted(MODES)}")
    work_dir = pathlib.Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    export = build_export(work_dir)
    sentences = test_sentences()
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "python bench/bench_version_swap.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "host": host_info(),
        "model": {**MODEL, "untrained": True, "export_mib": round(dir_size_mib(export), 1)},
        "setup": {"clients": args.clients, "swaps": args.swaps,
                  "steady_seconds": args.steady_seconds,
                  "settle_seconds": args.settle_seconds,
                  "request_timeout_s": args.request_timeout,
                  "tensorflow_intra_op": args.intra_op, "rest_api_num_threads": 32,
                  "batching": args.batching, "requests": "REST :predict, one "
                  "Multi30k test_2016_flickr sentence each, keep-alive"},
        "modes": {},
    }
    for mode in modes:
        result["modes"][mode] = run_mode(mode, export, sentences, args, work_dir)
    result["wall_seconds"] = round(time.time() - started, 1)
    out = pathlib.Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
