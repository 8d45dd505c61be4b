"""A REST server that speaks TF Serving's REST API for keras_trm exports.

TF Serving's own ``tensorflow_model_server`` is the production choice; it
needs a build that carries the tensorflow-text ops the text exports use.
This server (Flask) answers the same requests from a plain Python
environment with TensorFlow and tensorflow-text installed, so a client
written for TF Serving works unchanged against it.

Routes (https://www.tensorflow.org/tfx/serving/api_rest):

- ``GET  /v1/models/<name>`` and ``/v1/models/<name>/versions/<v>``:
  model status (``model_version_status``: version, ``AVAILABLE``).
- ``GET  /v1/models/<name>[/versions/<v>]/metadata``: the signatures'
  input/output names, dtypes and shapes.
- ``POST /v1/models/<name>[/versions/<v>]:predict`` with a JSON body
  ``{"signature_name": ..., "instances": [...]}`` (row format; answers
  ``{"predictions": [...]}``) or ``{"inputs": ...}`` (columnar; answers
  ``{"outputs": ...}``). Binary strings may be sent as ``{"b64": "..."}``;
  string outputs come back as UTF-8 text, or as ``{"b64": ...}`` where
  they are not valid UTF-8.

Errors answer ``{"error": "..."}`` with status 400 (bad request) or 404
(unknown model, version or signature), as TF Serving does.
"""

import base64
import pathlib
import threading

import numpy as np
import tensorflow as tf


class ModelRepository:
    """The versions of one model under ``<model_base_path>/<version>/``.

    Versions are loaded lazily with ``tf.saved_model.load`` and kept.
    Loading imports tensorflow_text first (if installed) so that
    exports with in-graph tokenizers load.

    Args:
        model_base_path: folder holding integer-named SavedModel folders.
        model_name: the name clients use in URLs (default: the folder name).

    Raises:
        FileNotFoundError: ``model_base_path`` holds no version folder with
            a ``saved_model.pb``.
    """

    def __init__(self, model_base_path, model_name=None):
        self.base = pathlib.Path(model_base_path)
        self.name = model_name or self.base.name
        self.versions = sorted(
            int(p.name) for p in self.base.glob("*")
            if p.name.isdigit() and (p / "saved_model.pb").exists())
        if not self.versions:
            raise FileNotFoundError(
                f"`model_base_path` {str(self.base)!r} holds no "
                "<version>/saved_model.pb folder")
        self._loaded = {}
        self._lock = threading.Lock()

    def load(self, version=None):
        """The loaded SavedModel of ``version`` (default: the latest)."""
        version = self.versions[-1] if version is None else int(version)
        if version not in self.versions:
            raise LookupError(
                f"model {self.name!r} has no version {version}; "
                f"available: {self.versions}")
        with self._lock:
            if version not in self._loaded:
                try:
                    import tensorflow_text  # noqa: F401  (registers ops)
                except ImportError:  # pragma: no cover - optional
                    pass
                self._loaded[version] = tf.saved_model.load(
                    str(self.base / str(version)))
        return version, self._loaded[version]


def _spec_json(spec):
    shape = [-1 if d is None else int(d) for d in spec.shape]
    return {"dtype": spec.dtype.name, "tensor_shape": shape, "name": spec.name}


def signature_metadata(signature):
    """Inputs/outputs of a concrete signature as JSON-ready dicts."""
    inputs = signature.structured_input_signature[1]
    outputs = signature.structured_outputs
    return {
        "inputs": {k: _spec_json(v) for k, v in inputs.items()},
        "outputs": {k: {"dtype": v.dtype.name,
                        "tensor_shape": [-1 if d is None else int(d)
                                         for d in v.shape]}
                    for k, v in outputs.items()},
    }


def _decode_b64(value):
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise ValueError(f"an object value must be {{'b64': ...}}, got keys {sorted(value)}")
        return base64.b64decode(value["b64"])
    if isinstance(value, list):
        return [_decode_b64(v) for v in value]
    return value


def _to_tensor(value, spec, name):
    value = _decode_b64(value)
    try:
        tensor = tf.constant(value, dtype=spec.dtype)
    except (TypeError, ValueError, tf.errors.InvalidArgumentError) as err:
        raise ValueError(
            f"input {name!r}: cannot convert to {spec.dtype.name}: {err}") from err
    if not spec.shape.is_compatible_with(tensor.shape):
        raise ValueError(
            f"input {name!r}: shape {tensor.shape.as_list()} does not match "
            f"the signature's {spec.shape}")
    return tensor


def _to_json(array):
    array = np.asarray(array)
    if array.dtype.kind in "SO":
        def text(b):
            try:
                return b.decode("utf-8")
            except UnicodeDecodeError:
                return {"b64": base64.b64encode(b).decode("ascii")}
        return np.vectorize(text, otypes=[object])(array).tolist() if array.ndim else text(array.item())
    return array.tolist()


def predict(signature, body):
    """Runs ``signature`` on a TF Serving REST ``:predict`` body.

    Args:
        signature: a concrete function from ``loaded.signatures``.
        body: the decoded JSON request (``instances`` or ``inputs``).

    Returns:
        ``{"predictions": [...]}`` (row format) or ``{"outputs": ...}``.

    Raises:
        ValueError: both or neither of ``instances`` / ``inputs``, a missing
            or unknown input name, or a value that does not fit the
            signature's dtype or shape.
    """
    specs = signature.structured_input_signature[1]
    if ("instances" in body) == ("inputs" in body):
        raise ValueError("the request needs exactly one of 'instances' or 'inputs'")
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list):
            raise ValueError("'instances' must be a list")
        if len(specs) == 1 and not (rows and isinstance(rows[0], dict)
                                    and set(rows[0]) <= set(specs)
                                    and "b64" not in rows[0]):
            (key,) = specs
            columns = {key: rows}
        else:
            if not all(isinstance(r, dict) for r in rows):
                raise ValueError("with several inputs each instance must be an object")
            columns = {k: [r[k] for r in rows] for k in specs
                       if rows and k in rows[0]}
    else:
        columns = body["inputs"]
        if not isinstance(columns, dict):
            if len(specs) != 1:
                raise ValueError("'inputs' must be an object naming each input")
            (key,) = specs
            columns = {key: columns}
    missing = sorted(set(specs) - set(columns))
    unknown = sorted(set(columns) - set(specs))
    if missing or unknown:
        raise ValueError(f"inputs missing: {missing}, unknown: {unknown}; "
                         f"the signature takes {sorted(specs)}")
    tensors = {k: _to_tensor(v, specs[k], k) for k, v in columns.items()}
    outputs = {k: v.numpy() for k, v in signature(**tensors).items()}
    if "instances" in body:
        if len(outputs) == 1:
            (out,) = outputs.values()
            return {"predictions": _to_json(out)}
        n = len(next(iter(outputs.values())))
        return {"predictions": [{k: _to_json(v[i]) for k, v in outputs.items()}
                                for i in range(n)]}
    if len(outputs) == 1:
        (out,) = outputs.values()
        return {"outputs": _to_json(out)}
    return {"outputs": {k: _to_json(v) for k, v in outputs.items()}}


def create_app(model_base_path, model_name=None):
    """A Flask app serving one model's versions on TF Serving's REST routes.

    Args:
        model_base_path: ``export/<model_name>`` (the folder of versions).
        model_name: URL name (default: the folder's name).

    Returns:
        ``flask.Flask``; run it with ``app.run(port=8501)`` or any WSGI
        server.
    """
    import flask

    repo = ModelRepository(model_base_path, model_name)
    app = flask.Flask("keras_trm.serving")

    def error(message, status):
        return flask.jsonify({"error": message}), status

    def resolve(name, version):
        if name != repo.name:
            raise LookupError(f"unknown model {name!r}; this server has {repo.name!r}")
        return repo.load(version)

    @app.get("/v1/models/<name>")
    @app.get("/v1/models/<name>/versions/<int:version>")
    def status(name, version=None):
        if name != repo.name:
            return error(f"unknown model {name!r}; this server has {repo.name!r}", 404)
        versions = repo.versions if version is None else [version]
        if version is not None and version not in repo.versions:
            return error(f"model {name!r} has no version {version}", 404)
        return flask.jsonify({"model_version_status": [
            {"version": str(v), "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}
            for v in reversed(versions)]})

    @app.get("/v1/models/<name>/metadata")
    @app.get("/v1/models/<name>/versions/<int:version>/metadata")
    def metadata(name, version=None):
        try:
            version, loaded = resolve(name, version)
        except LookupError as err:
            return error(str(err), 404)
        return flask.jsonify({
            "model_spec": {"name": name, "signature_name": "",
                           "version": str(version)},
            "metadata": {"signature_def": {"signature_def": {
                k: signature_metadata(s) for k, s in loaded.signatures.items()}}},
        })

    @app.post("/v1/models/<name>:predict")
    @app.post("/v1/models/<name>/versions/<int:version>:predict")
    def predict_route(name, version=None):
        try:
            version, loaded = resolve(name, version)
        except LookupError as err:
            return error(str(err), 404)
        body = flask.request.get_json(silent=True)
        if not isinstance(body, dict):
            return error("the request body must be a JSON object", 400)
        signature_name = body.get("signature_name", "serving_default")
        if signature_name not in loaded.signatures:
            return error(f"unknown signature_name {signature_name!r}; "
                         f"available: {sorted(loaded.signatures)}", 404)
        try:
            return flask.jsonify(predict(loaded.signatures[signature_name], body))
        except (ValueError, tf.errors.InvalidArgumentError) as err:
            return error(str(err), 400)

    return app
