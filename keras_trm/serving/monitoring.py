"""Prometheus metrics as ``tensorflow_model_server`` exports them.

TF Serving serves its metrics on the REST port when started with
``--monitoring_config_file`` naming a text ``MonitoringConfig``::

    prometheus_config {
      enable: true
      path: "/monitoring/prometheus/metrics"
    }

``keras-trm serve`` reads the same file and answers ``GET <path>`` in the
Prometheus text format (``prometheus_client``), with TF Serving's request
metrics under their names:

- ``:tensorflow:serving:request_count{model_name, status}``: requests per
  model and status code name (``OK``, ``INVALID_ARGUMENT``, ``NOT_FOUND``,
  ...). ``prometheus_client`` writes a counter's samples with the
  ``_total`` suffix of the OpenMetrics convention
  (``:tensorflow:serving:request_count_total``).
- ``:tensorflow:serving:request_latency{model_name, API, entrypoint}``: a
  histogram of the wall time of each request, in microseconds, with TF
  Serving's buckets (10 µs x 1.8^k, 33 buckets); ``API`` is ``Predict``,
  ``GetModelMetadata`` or ``GetModelStatus``, ``entrypoint`` ``REST`` or
  ``GRPC``.

Requests that name no model (``/healthz``, unknown routes) are not counted.
"""

import pathlib

DEFAULT_PATH = "/monitoring/prometheus/metrics"
# TF Serving's request_latency buckets: Exponential(10, 1.8, 33), in µs.
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
        """Counts one answered request.

        Args:
            model_name: str, the model the request named.
            api: ``"Predict"``, ``"GetModelMetadata"`` or ``"GetModelStatus"``.
            entrypoint: ``"REST"`` or ``"GRPC"``.
            status: TF Serving's status code name, ``"OK"`` on success.
            seconds: float, the request's wall time.
        """
        self.request_count.labels(model_name, status).inc()
        self.request_latency.labels(model_name, api, entrypoint).observe(seconds * 1e6)

    def text(self):
        """The metrics in the Prometheus text format (bytes)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


_config_cls = None


def _monitoring_config_class():
    """TF Serving's ``MonitoringConfig`` message (built here: the
    ``tensorflow-serving-api`` package does not ship its module)."""
    global _config_cls
    if _config_cls is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        fields = descriptor_pb2.FieldDescriptorProto
        proto = descriptor_pb2.FileDescriptorProto(
            name="keras_trm_monitoring_config.proto", package="tensorflow.serving",
            syntax="proto3")
        prometheus = proto.message_type.add(name="PrometheusConfig")
        prometheus.field.add(name="enable", number=1, type=fields.TYPE_BOOL,
                             label=fields.LABEL_OPTIONAL)
        prometheus.field.add(name="path", number=2, type=fields.TYPE_STRING,
                             label=fields.LABEL_OPTIONAL)
        config = proto.message_type.add(name="MonitoringConfig")
        config.field.add(name="prometheus_config", number=1, type=fields.TYPE_MESSAGE,
                         label=fields.LABEL_OPTIONAL,
                         type_name=".tensorflow.serving.PrometheusConfig")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto)
        _config_cls = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))
    return _config_cls


def monitoring_path(monitoring_config_file=None):
    """The URL path of the Prometheus metrics from a text
    ``MonitoringConfig`` file, or None where metrics are off (no file, or
    ``enable`` not true).

    Args:
        monitoring_config_file: path or None.

    Returns:
        str starting with ``/`` (``DEFAULT_PATH`` when the file gives none),
        or None.

    Raises:
        ValueError: the file is missing or does not parse, or its ``path``
            does not start with ``/``; the message names
            ``monitoring_config_file`` and the file.
    """
    if monitoring_config_file is None:
        return None
    from keras_trm.serving.config import _parse_text_proto

    path = pathlib.Path(monitoring_config_file)
    config = _monitoring_config_class()()
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
        # It would answer in place of the REST API's own route.
        raise ValueError(f"`monitoring_config_file` {str(path)!r}: prometheus_config "
                         f"path {url_path!r} is a route of the REST API (/v1/..., "
                         "/healthz, /readyz)")
    return url_path
