"""TF Serving's REST API (https://www.tensorflow.org/tfx/serving/api_rest)
as a WSGI app over a ``ModelManager``; ``/labels/<label>`` may stand for
``/versions/<v>``:

- ``GET /v1/models/<name>[/versions/<v>]``: the status
  (``{"model_version_status": [{"version": "2", "state": "AVAILABLE", ...}]}``);
  ``.../metadata``: the SignatureDefs in protobuf JSON form.
- ``POST /v1/models/<name>[/versions/<v>]:predict`` with ``{"instances":
  [...]}`` (row format, answers ``{"predictions": [...]}``) or ``{"inputs":
  ...}`` (columnar, answers ``{"outputs": ...}``), and an optional
  ``signature_name``. Binary strings may be sent as ``{"b64": "..."}``;
  string outputs are UTF-8 text, or ``{"b64": ...}`` where not valid UTF-8.
- ``GET /healthz``; ``GET /readyz`` (503 until every model has an available
  version, and while shutting down); ``GET <metrics_path>`` where given.

Every error is JSON ``{"error": "..."}``: 400 for a malformed request, 404
for an unknown model, version, label, signature or route, 405 for a wrong
method, 413 for a body over ``max_request_bytes``, 503 when a batch queue
is full or the server is shutting down, 500 naming the exception otherwise.
"""

import base64
import binascii
import json
import math
import sys
import threading
import time
import types

import numpy as np

from keras_trm.serving.errors import (
    InvalidArgument, ServingError, Unavailable, check_input_names)

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# Rows one request may hold (REST and gRPC): a million tiny instances, or a
# TensorProto declaring shape [200000] with one value, expand to gigabytes.
DEFAULT_MAX_REQUEST_ROWS = 4096
# TF Serving's status code name of a REST answer, where no ServingError named it.
_STATUS_CODE = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED",
                413: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
# Significand bits: the largest integer a float dtype holds exactly is 2**bits - 1.
_SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11, "float32": 24, "float64": 53}


def check_rows(name, rows, max_request_rows):
    """Raises ``InvalidArgument`` when input ``name`` has more than
    ``max_request_rows`` rows (its first dimension).

    Example:
    >>> check_rows("text", 5, 4)   # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    InvalidArgument: input 'text' has 5 rows, over the limit of 4 rows per request ...
    """
    if rows > max_request_rows:
        raise InvalidArgument(f"input {name!r} has {rows} rows, over the limit of "
                              f"{max_request_rows} rows per request (max_request_rows)")


def _is_b64(value):
    return isinstance(value, dict) and set(value) == {"b64"}


def _decode_b64(value, name):
    if isinstance(value, list):
        return [_decode_b64(v, name) for v in value]
    if not isinstance(value, dict):
        return value
    if not _is_b64(value) or not isinstance(value["b64"], str):
        raise InvalidArgument(f"input {name!r}: an object value must be {{\"b64\": \"<base64 "
                              f"text>\"}}, got keys {sorted(value)}")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidArgument(f"input {name!r}: bad base64 text: {err}") from err


def _too_big(text):
    shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
    return InvalidArgument(f"JSON Parse error: Number too big to be stored in double: {shown}")


def _json_float(text):
    if math.isinf(value := float(text)):
        raise _too_big(text)
    return value


def _json_int(text):
    # The length check first keeps int() off numbers of many thousand digits.
    if len(text.lstrip("-")) > 310 or abs(int(text)) > sys.float_info.max:
        raise _too_big(text)
    return int(text)


def parse_json(text):
    """``json.loads`` refusing, as rapidjson (TF Serving's parser) does, a
    number beyond the float64 range (``1e400``, a 400-digit integer), which
    Python would read as inf or as an integer too long to print back.

    Raises:
        InvalidArgument: "JSON Parse error: ..." for malformed JSON, such a
            number, or nesting past Python's recursion limit.

    Example:
    >>> parse_json('{"x": [1.5, 2]}')
    {'x': [1.5, 2]}
    """
    try:
        return json.loads(text, parse_float=_json_float, parse_int=_json_int)
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"JSON Parse error: {err}") from err
    except RecursionError:
        raise InvalidArgument("JSON Parse error: the body is nested too deeply (more than "
                              f"about {sys.getrecursionlimit()} levels)") from None


def number_problem(value, dtype):
    """Why the JSON number ``value`` (a Python bool, int or float) cannot be
    an element of a ``dtype`` tensor, or None, by TF Serving's rules
    (``tensorflow_serving/util/json_tensor.cc``): a boolean only for a bool
    tensor, integers in range for an integer tensor, and for a float tensor
    an integer it holds exactly or a finite decimal in range (NaN and
    ±Infinity pass). ``tf.constant`` alone wraps 2**40 to 0 in int32.

    Example:
    >>> import tensorflow as tf
    >>> number_problem(2**40, tf.int32)
    '1099511627776 is out of the range of int32 [-2147483648, 2147483647]'
    >>> number_problem(0.5, tf.float32) is None
    True
    """
    kind, text = dtype.name, json.dumps(value)
    if isinstance(value, bool):
        return None if kind == "bool" else f"{text} is a boolean; the input takes {kind} numbers"
    if kind == "bool":
        return f"{text} is not a boolean (true or false)"
    if dtype.is_integer:
        low, high = int(dtype.min), int(dtype.max)
        if not isinstance(value, int):
            return f"{text} is not an integer; the input takes {kind}"
        if not low <= value <= high:
            return f"{text} is out of the range of {kind} [{low}, {high}]"
    elif isinstance(value, int):
        if abs(value) > 2 ** _SIGNIFICAND_BITS.get(kind, 53) - 1:
            return f"{text} cannot be a {kind} without loss of precision"
    elif math.isfinite(value) and abs(value) > float(dtype.max):
        return f"{text} is out of the range of {kind} (at most {float(dtype.max):.6g})"
    return None


def to_array(value, spec, name):
    """A JSON value as a numpy array of ``spec``'s dtype.

    Raises:
        InvalidArgument: the value is ragged, of the wrong type, or empty.
    """
    import tensorflow as tf

    value, dtype = _decode_b64(value, name), spec.dtype
    numeric = dtype.is_integer or dtype.is_floating or dtype == tf.bool

    def check(v):  # JSON numbers are not strings, nor strings numbers
        if isinstance(v, list):
            for item in v:
                check(item)
        elif dtype == tf.string and not isinstance(v, (str, bytes)):
            raise InvalidArgument(f"input {name!r} expects strings (dtype string), got "
                                  f"{type(v).__name__} {v!r}")
        elif numeric and (isinstance(v, (str, bytes, dict)) or v is None):
            raise InvalidArgument(f"input {name!r} expects numbers (dtype {dtype.name}), "
                                  f"got {type(v).__name__} {v!r}")
        elif numeric and (problem := number_problem(v, dtype)) is not None:
            raise InvalidArgument(f"input {name!r}: {problem}")

    check(value)
    try:
        array = tf.constant(value, dtype=dtype).numpy()
    except (TypeError, ValueError, OverflowError, tf.errors.InvalidArgumentError) as err:
        raise InvalidArgument(f"input {name!r}: cannot convert to a {dtype.name} tensor "
                              f"(ragged lists or wrong types?): {err}") from err
    # A scalar comes back as a numpy scalar or bytes: an array still, so
    # that the dtype and shape checks name it.
    return array if isinstance(array, np.ndarray) else np.asarray(array, dtype=object)


def request_arrays(body, specs, max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
    """Parses a ``:predict`` body into ``({name: array}, row_format)``.

    ``body`` is the decoded JSON object, ``specs`` the signature's ``{input
    name: tf.TensorSpec}``; ``max_request_rows`` is checked before any value
    is converted.

    Raises:
        InvalidArgument: both or neither of ``instances``/``inputs``, an
            empty list, instances not alike, missing or unknown inputs,
            more than ``max_request_rows`` rows, or values that do not convert.
    """
    if ("instances" in body) == ("inputs" in body):
        raise InvalidArgument("the request needs exactly one of 'instances' (row format) or "
                              f"'inputs' (columnar format); got keys {sorted(body)}")
    names = sorted(specs)
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list):
            raise InvalidArgument(f"'instances' must be a list, got {type(rows).__name__}")
        if not rows:
            raise InvalidArgument("'instances' is an empty list")
        check_rows("instances", len(rows), max_request_rows)
        named = all(isinstance(r, dict) and not _is_b64(r) for r in rows)
        if len(specs) == 1 and not (named and set(rows[0]) <= set(specs)):
            columns = {names[0]: rows}
        else:
            for i, row in enumerate(rows):
                if not isinstance(row, dict) or _is_b64(row):
                    raise InvalidArgument(f"instance {i} is a {type(row).__name__}; with inputs "
                                          f"{names} each instance must be an object naming them")
                if set(row) != set(rows[0]):
                    raise InvalidArgument(
                        f"instance {i} has keys {sorted(row)} but instance 0 has "
                        f"{sorted(rows[0])}; every instance needs the same inputs")
            columns = {k: [r[k] for r in rows] for k in rows[0]}
    else:
        columns = body["inputs"]
        if not isinstance(columns, dict) or _is_b64(columns):
            if len(specs) != 1:
                raise InvalidArgument(f"'inputs' must be an object naming the inputs {names}")
            columns = {names[0]: columns}
        if not columns:
            raise InvalidArgument("'inputs' is an empty object")
    check_input_names(specs, columns)
    for key, value in columns.items():
        if isinstance(value, list):
            if not value:
                raise InvalidArgument(f"input {key!r} is an empty list")
            check_rows(key, len(value), max_request_rows)
    return {k: to_array(v, specs[k], k) for k, v in columns.items()}, "instances" in body


def _text(value):
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(value).decode("ascii")}


def to_json(array):
    """A numpy array as JSON-ready lists (strings as text or ``{"b64"}``)."""
    array = np.asarray(array)
    if array.dtype.kind not in "SO":
        return array.tolist()
    return np.vectorize(_text, otypes=[object])(array).tolist()


def response_json(outputs, row_format):
    """``{"predictions": ...}`` (row format) or ``{"outputs": ...}``.

    Raises:
        InvalidArgument: row format asked of outputs whose axis 0 differs
            (use the columnar format).
    """
    key = "predictions" if row_format else "outputs"
    if len(outputs) == 1:
        return {key: to_json(next(iter(outputs.values())))}
    columns = {k: to_json(v) for k, v in outputs.items()}
    if not row_format:
        return {key: columns}
    sizes = {k: (np.shape(v)[0] if np.ndim(v) else None) for k, v in outputs.items()}
    if None in sizes.values() or len(set(sizes.values())) != 1:
        raise InvalidArgument(f"outputs have different batch sizes {sizes}, which the row format "
                              "('instances') cannot express; send 'inputs' (columnar format)")
    n = next(iter(sizes.values()))
    return {key: [{k: columns[k][i] for k in columns} for i in range(n)]}


def signature_defs_json(servable):
    """The SignatureDefs in TF Serving's JSON form."""
    from google.protobuf import json_format

    return {name: json_format.MessageToDict(
        sig, preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True)
        for name, sig in sorted(servable.signature_defs.items())}


def status_json(entries):
    """``ModelManager.status`` entries as TF Serving's status JSON."""
    return {"model_version_status": [
        {"version": str(v), "state": state,
         "status": {"error_code": "UNKNOWN" if error else "OK",
                    "error_message": error}}
        for v, state, error in entries]}


def create_app(manager, model_name=None, max_request_bytes=DEFAULT_MAX_REQUEST_BYTES,
               metrics=None, metrics_path=None,
               max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
    """A Flask WSGI app answering TF Serving's REST API.

    Args:
        manager: a started ``ModelManager``, or a model base path (a folder
            of versions) to serve alone, unpolled.
        model_name: URL name when ``manager`` is a path (default: the
            folder's name).
        max_request_bytes: int, larger bodies get 413.
        max_request_rows: int, more instances in one request get 400.
        metrics: optional ``monitoring.Metrics`` recording every request
            that names a model.
        metrics_path: URL path answering ``GET`` with ``metrics`` in the
            Prometheus text format.

    Returns:
        ``flask.Flask`` for a WSGI server (``ModelServer`` uses waitress) or
        ``app.test_client()``; ``app.in_flight.count`` counts the requests
        being answered (``app.in_flight.cond`` notified at each end), and
        ``app.in_flight.draining = True`` makes new ones get 503.

    Raises:
        FileNotFoundError: ``manager`` is a path that is not a folder.
    """
    import flask
    import werkzeug.exceptions

    from keras_trm.serving.manager import ModelManager

    if not isinstance(manager, ModelManager):
        from keras_trm.serving.config import model_server_config

        base_path = manager
        config = model_server_config([model_name] if model_name else [], [base_path])
        manager = ModelManager(config, file_system_poll_wait_seconds=-1)
        manager.start()
        if not manager.ready():
            raise FileNotFoundError(f"`model_base_path` {str(base_path)!r} holds no loadable "
                                    "<version>/saved_model.pb")

    app = flask.Flask("keras_trm.serving")
    app.config["MAX_CONTENT_LENGTH"] = int(max_request_bytes)
    app.manager = manager
    app.in_flight = in_flight = types.SimpleNamespace(
        count=0, draining=False, cond=threading.Condition())

    def reply(payload, status=200):
        # An answer json.dumps refuses raises here: the Exception handler's 500.
        return flask.Response(json.dumps(payload, ensure_ascii=False), status=status,
                              mimetype="application/json")

    def error(message, status):
        return reply({"error": message}, status)

    @app.errorhandler(ServingError)
    def serving_error(err):
        flask.g.status_code = err.code
        return error(str(err), err.http_status)

    @app.errorhandler(werkzeug.exceptions.HTTPException)
    def http_error(err):
        if err.code == 413:
            return error(f"the request body is over the limit of {max_request_bytes} "
                         "bytes (max_request_bytes)", 413)
        return error(f"{err.name}: {err.description}", err.code or 500)

    @app.errorhandler(Exception)
    def internal_error(err):
        app.logger.exception("request failed")
        return error(f"Internal: {type(err).__name__}: {err}", 500)

    @app.before_request
    def count_in():
        flask.g.start = time.perf_counter()
        with in_flight.cond:
            in_flight.count += 1
        flask.g.counted = True
        if in_flight.draining and flask.request.path != "/healthz":
            raise Unavailable("the server is shutting down")

    if metrics is not None:
        apis = {"predict_route": "Predict", "metadata": "GetModelMetadata",
                "status": "GetModelStatus"}

        @app.after_request
        def record(response):
            name = (flask.request.view_args or {}).get("name")
            api = apis.get(flask.request.endpoint)
            if name is not None and api is not None:
                code = flask.g.get("status_code") or _STATUS_CODE.get(
                    response.status_code, "UNKNOWN")
                metrics.record(name, api, "REST", code, time.perf_counter() - flask.g.start)
            return response

        if metrics_path:
            @app.get(metrics_path)
            def prometheus_metrics():
                from prometheus_client import CONTENT_TYPE_LATEST

                return flask.Response(metrics.text(), mimetype=CONTENT_TYPE_LATEST)

    @app.teardown_request
    def count_out(_exc):
        if flask.g.pop("counted", False):
            with in_flight.cond:
                in_flight.count -= 1
                in_flight.cond.notify_all()

    @app.get("/healthz")
    def healthz():
        return reply({"status": "alive"})

    @app.get("/readyz")
    def readyz():
        if in_flight.draining or not manager.ready():
            return error("not ready: a model has no available version yet", 503)
        with in_flight.cond:
            others = in_flight.count - 1  # this request is counted too
        return reply({"status": "ready", "models": manager.model_names,
                      "requests_in_flight": others})

    @app.get("/v1/models/<name>")
    @app.get("/v1/models/<name>/versions/<int:version>")
    @app.get("/v1/models/<name>/labels/<label>")
    def status(name, version=None, label=None):
        if ":" in name:  # GET /v1/models/<name>:predict: the POST-only route
            raise werkzeug.exceptions.MethodNotAllowed(valid_methods=["POST"])
        return reply(status_json(manager.status(name, version, label)))

    @app.get("/v1/models/<name>/metadata")
    @app.get("/v1/models/<name>/versions/<int:version>/metadata")
    @app.get("/v1/models/<name>/labels/<label>/metadata")
    def metadata(name, version=None, label=None):
        with manager.acquire(name, version, label) as servable:
            return reply({
                "model_spec": {"name": name, "signature_name": "",
                               "version": str(servable.version)},
                "metadata": {"signature_def": {
                    "signature_def": signature_defs_json(servable)}},
            })

    @app.post("/v1/models/<name>:<verb>")
    @app.post("/v1/models/<name>/versions/<int:version>:<verb>")
    @app.post("/v1/models/<name>/labels/<label>:<verb>")
    def predict_route(name, verb, version=None, label=None):
        if verb != "predict":
            raise ServingError(f"':{verb}' is not supported by this server; use "
                               "':predict'", code="UNIMPLEMENTED")
        with manager.acquire(name, version, label) as servable:
            try:
                text = flask.request.get_data(cache=False).decode("utf-8")
            except UnicodeDecodeError as err:
                raise InvalidArgument(f"the request body is not UTF-8 text: {err}") from err
            body = parse_json(text)
            if not isinstance(body, dict):
                raise InvalidArgument(
                    f"the request body must be a JSON object, got {type(body).__name__}")
            signature_name = body.get("signature_name", "serving_default")
            if not isinstance(signature_name, str):
                raise InvalidArgument(
                    f"'signature_name' must be a string, got {signature_name!r}")
            specs = servable.input_specs(signature_name)
            arrays, row_format = request_arrays(body, specs, max_request_rows)
            return reply(response_json(servable.predict(signature_name, arrays), row_format))

    return app
