"""Prometheus metrics as ``tensorflow_model_server`` exports them: with
``--monitoring_config_file`` naming a text ``MonitoringConfig``
(``prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }``),
``GET <path>`` on the REST port answers, in the Prometheus text format:

- ``:tensorflow:serving:request_count{model_name, status}``: requests per
  model and status code name (``OK``, ``NOT_FOUND``, ...), written with the
  OpenMetrics suffix (``..._total``);
- ``:tensorflow:serving:request_latency{model_name, API, entrypoint}``: a
  histogram of wall times in µs, with TF Serving's buckets (10 µs x 1.8^k,
  33 buckets); ``API`` is ``Predict``, ``GetModelMetadata`` or
  ``GetModelStatus``, ``entrypoint`` ``REST`` or ``GRPC``.

Requests that name no model (``/healthz``, unknown routes) are not counted.
"""

import pathlib

DEFAULT_PATH = "/monitoring/prometheus/metrics"
LATENCY_BUCKETS_MICROS = tuple(round(10 * 1.8 ** k, 3) for k in range(33))


class Metrics:
    """TF Serving's request metrics in their own ``prometheus_client``
    registry (one per server, so servers in one process do not mix).

    Example:
        >>> metrics = Metrics()
        >>> metrics.record("translator", "Predict", "REST", "OK", 0.0125)
        >>> b'request_count_total{model_name="translator",status="OK"} 1.0' in metrics.text()
        True
    """

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.request_count = Counter(
            ":tensorflow:serving:request_count", "The total number of requests.",
            ["model_name", "status"], registry=self.registry)
        self.request_latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving "
            "request.", ["model_name", "API", "entrypoint"],
            buckets=LATENCY_BUCKETS_MICROS, registry=self.registry)

    def record(self, model_name, api, entrypoint, status, seconds):
        """Counts one answered request: ``api`` is ``"Predict"``,
        ``"GetModelMetadata"`` or ``"GetModelStatus"``, ``entrypoint``
        ``"REST"`` or ``"GRPC"``, ``status`` TF Serving's status code name
        (``"OK"`` on success), ``seconds`` its wall time."""
        self.request_count.labels(model_name, status).inc()
        self.request_latency.labels(model_name, api, entrypoint).observe(seconds * 1e6)

    def text(self):
        """The metrics in the Prometheus text format (bytes)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def monitoring_path(monitoring_config_file=None):
    """The URL path (``DEFAULT_PATH`` where the file gives none) of the
    Prometheus metrics from a text ``MonitoringConfig`` file (a path), or
    None where metrics are off (no file, or ``enable`` not true).

    Raises:
        ValueError: the file is missing or does not parse, or its ``path``
            does not start with ``/`` or is a route of the REST API; the
            message names ``monitoring_config_file`` and the file.
    """
    if monitoring_config_file is None:
        return None
    from keras_trm.serving.config import _message_class, _parse_text_proto

    path = pathlib.Path(monitoring_config_file)
    config = _message_class("MonitoringConfig")()
    _parse_text_proto(path, config, "monitoring_config_file")
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    url_path = prometheus.path or DEFAULT_PATH
    if not url_path.startswith("/"):
        raise ValueError(f"`monitoring_config_file` {str(path)!r}: prometheus_config "
                         f"path must start with '/', got {url_path!r}")
    if url_path.rstrip("/") in ("", "/healthz", "/readyz", "/v1") or (
            url_path.startswith("/v1/")):
        raise ValueError(f"`monitoring_config_file` {str(path)!r}: prometheus_config path "
                         f"{url_path!r} is a route of the REST API (/v1/..., /healthz, /readyz)")
    return url_path
