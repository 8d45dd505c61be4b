"""The model server: one process holding the models, TF Serving's REST API
on waitress (a production WSGI server with a bounded thread pool) and its
gRPC API on grpcio, graceful shutdown on SIGTERM / SIGINT.
"""

import concurrent.futures
import json
import logging
import os
import signal
import sys
import threading
import time

from keras_trm.serving.rest import (DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_REQUEST_ROWS,
                                    create_app)

log = logging.getLogger("keras_trm.serving")


def _json_error_channel(max_request_bytes):
    """waitress' HTTP channel whose own errors (400 bad HTTP, 413 body over
    the limit, 500) are JSON ``{"error": ...}`` rather than text."""
    from waitress.channel import HTTPChannel
    from waitress.task import ErrorTask

    class JsonErrorTask(ErrorTask):
        def execute(self):
            err = self.request.error
            message = f"{err.reason}: {err.body}" if err.code != 413 else (
                f"the request body is over the limit of {max_request_bytes} bytes "
                "(max_request_bytes)")
            body = json.dumps({"error": message}).encode("utf-8")
            self.status = f"{err.code} {err.reason}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class JsonErrorChannel(HTTPChannel):
        error_task_class = JsonErrorTask

    return JsonErrorChannel


class ModelServer:
    """REST + gRPC over one ``ModelManager``.

    Args:
        manager: a ``ModelManager`` (started by ``start()`` if not yet).
        host: interface to bind, e.g. ``"127.0.0.1"`` or ``"0.0.0.0"``.
        rest_api_port, grpc_port: int; 0 picks a free port; None serves none.
        rest_api_num_threads, grpc_max_threads: worker threads (requests
            answered at once; more wait in a queue).
        max_request_bytes: largest REST body / gRPC message accepted.
        max_request_rows: the most rows (instances) one request may hold,
            checked before any value is expanded.
        monitoring_path: URL path on the REST port answering TF Serving's
            Prometheus metrics (``keras_trm.serving.monitoring``); None: none.

    Attributes:
        rest_api_port, grpc_port: the bound ports once started.
        metrics: the ``monitoring.Metrics`` recorded, or None.

    Raises:
        ValueError: a thread count, ``max_request_bytes`` or
            ``max_request_rows`` below 1, or a ``monitoring_path`` without
            REST (``rest_api_port=None``).
        OSError: from ``start()``, when a port cannot be bound (naming
            ``rest_api_port`` or ``grpc_port``, the address and why).

    Example:
        >>> server = ModelServer(manager, rest_api_port=0, grpc_port=0).start()
        >>> requests.post(f"http://127.0.0.1:{server.rest_api_port}/v1/models/m:predict", ...)
        >>> server.stop()
    """

    def __init__(self, manager, host="127.0.0.1", rest_api_port=8501, grpc_port=8500,
                 rest_api_num_threads=16, grpc_max_threads=16,
                 max_request_bytes=DEFAULT_MAX_REQUEST_BYTES, monitoring_path=None,
                 max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
        for name, value in (("rest_api_num_threads", rest_api_num_threads),
                            ("grpc_max_threads", grpc_max_threads),
                            ("max_request_bytes", max_request_bytes),
                            ("max_request_rows", max_request_rows)):
            if int(value) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {name}={value}")
        if monitoring_path is not None and rest_api_port is None:
            raise ValueError(f"`monitoring_path` {monitoring_path!r} is served on the REST "
                             "port, but rest_api_port=None serves no REST")
        from keras_trm.serving.monitoring import Metrics

        self.monitoring_path = monitoring_path
        self.metrics = Metrics() if monitoring_path is not None else None
        self.manager = manager
        self.host = host
        self.rest_api_port = rest_api_port
        self.grpc_port = grpc_port
        self.rest_api_num_threads = int(rest_api_num_threads)
        self.grpc_max_threads = int(grpc_max_threads)
        self.max_request_bytes = int(max_request_bytes)
        self.max_request_rows = int(max_request_rows)
        self.app = self._rest = self._rest_thread = self._grpc = None
        self._stopped = threading.Event()

    def start(self):
        """Loads the models (blocking) and starts listening; returns self.
        If a port cannot be bound, it stops what it started (the models too,
        unless the manager was started before) and raises ``OSError``."""
        started_here = not self.manager.started
        if started_here:
            self.manager.start()
        try:
            self._listen()
        except BaseException:
            self.stop(grace=0, stop_manager=started_here)
            raise
        log.info("serving %s: REST on %s:%s, gRPC on %s:%s (pid %d)",
                 self.manager.model_names, self.host, self.rest_api_port, self.host,
                 self.grpc_port, os.getpid())
        return self

    def _listen(self):
        if self.grpc_port is not None:
            import grpc

            from keras_trm.serving.grpc_service import add_services

            options = [("grpc.max_receive_message_length", self.max_request_bytes),
                       ("grpc.max_send_message_length", -1),
                       ("grpc.so_reuseport", 0)]
            self._grpc = grpc.server(
                concurrent.futures.ThreadPoolExecutor(
                    self.grpc_max_threads, thread_name_prefix="grpc"),
                options=options, maximum_concurrent_rpcs=4 * self.grpc_max_threads)
            add_services(self._grpc, self.manager, self.metrics, self.max_request_rows)
            address = f"{self.host}:{self.grpc_port}"
            try:
                bound = self._grpc.add_insecure_port(address)
            except RuntimeError:  # grpcio >= 1.50 raises; older ones return 0
                bound = 0
            if not bound:
                raise OSError(f"grpc_port {self.grpc_port}: cannot listen on {address} "
                              "(in use by another process, or not allowed)")
            self.grpc_port = bound
            self._grpc.start()
        if self.rest_api_port is not None:
            import waitress

            self.app = create_app(self.manager, max_request_bytes=self.max_request_bytes,
                                  metrics=self.metrics, metrics_path=self.monitoring_path,
                                  max_request_rows=self.max_request_rows)
            try:
                self._rest = waitress.create_server(
                    self.app, host=self.host, port=self.rest_api_port,
                    threads=self.rest_api_num_threads,
                    max_request_body_size=self.max_request_bytes,
                    connection_limit=1000, channel_timeout=120, ident="keras-trm")
            except OSError as err:
                raise OSError(err.errno, f"rest_api_port {self.rest_api_port}: cannot "
                              f"listen on {self.host}:{self.rest_api_port}: "
                              f"{err.strerror or err}") from err
            self._rest.channel_class = _json_error_channel(self.max_request_bytes)
            self.rest_api_port = int(self._rest.effective_port)
            self._rest_thread = threading.Thread(target=self._run_rest, name="rest", daemon=True)
            self._rest_thread.start()

    def _run_rest(self):
        try:
            self._rest.run()
        except (OSError, ValueError):
            # select() on a socket closed by stop()'s fallback path below.
            if not self._stopped.is_set():
                raise

    def stop(self, grace=30.0, stop_manager=True):
        """Graceful shutdown: refuse new requests (503 / ``readyz`` fails),
        let in-flight ones finish (up to ``grace`` seconds), close, and
        unload the models unless ``stop_manager`` is False."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grpc_done = self._grpc.stop(grace) if self._grpc is not None else None
        if self._rest is not None:
            in_flight = self.app.in_flight
            in_flight.draining = True
            with in_flight.cond:
                if not in_flight.cond.wait_for(lambda: in_flight.count == 0, grace):
                    log.warning("%d REST request(s) still running after %.0f s",
                                in_flight.count, grace)
            from waitress import wasyncore
            from waitress.channel import HTTPChannel

            server = self._rest
            # Let waitress send what the app answered before closing sockets.
            deadline = time.monotonic() + min(grace, 10.0)
            while time.monotonic() < deadline and any(
                    channel.requests or channel.total_outbufs_len
                    for channel in list(server._map.values())
                    if isinstance(channel, HTTPChannel)):
                time.sleep(0.02)
            try:  # close every socket from waitress' own loop thread
                server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
            except OSError as err:
                # Its wake-up pipe is gone (seen once in CI: EBADF after a swap).
                log.warning("REST loop's wake-up pipe is unusable (%s); closing its "
                            "sockets from the stopping thread", err)
                wasyncore.close_all(server._map, ignore_all=True)
            self._rest_thread.join(timeout=10)
            server.task_dispatcher.shutdown(timeout=grace)
        if grpc_done is not None:
            grpc_done.wait(grace)
        if stop_manager:
            self.manager.stop()
        log.info("server stopped")

    def serve_forever(self, grace=30.0, info=None, exit_after_grace=False):
        """Starts, then serves until SIGTERM or SIGINT, then ``stop(grace)``.
        Once listening, prints one JSON line to stdout (models, host, ports,
        pid, plus the ``info`` dict) for scripts that wait for it.

        With ``exit_after_grace`` (``keras-trm serve``) the process then
        exits (status 0), dropping a request still in a model, as TF
        Serving does; should the shutdown hang, it exits ``grace`` + 10 s
        after the signal."""
        stop = threading.Event()

        def on_signal(signum, _frame):
            log.info("signal %d: shutting down gracefully", signum)
            stop.set()
            if exit_after_grace:
                watchdog = threading.Timer(grace + 10.0, _exit_now,
                                           args=("shutdown took too long",))
                watchdog.daemon = True
                watchdog.start()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            print(json.dumps({"serving": self.manager.model_names, "host": self.host,
                              "rest_api_port": self.rest_api_port,
                              "grpc_port": self.grpc_port, "pid": os.getpid(),
                              **(info or {})}),
                  flush=True)
            while not stop.wait(1.0):  # wakes for the signal handler
                pass
        finally:
            self.stop(grace)
            for s, handler in previous.items():
                signal.signal(s, handler)
        if exit_after_grace:  # threads still in a model would keep the process alive
            _exit_now("stopped")


def _exit_now(why):
    """Ends the process at once (status 0), logs and output flushed."""
    log.info("exiting: %s", why)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
