"""Models and versions as TF Serving manages them.

``ModelManager`` holds every configured model's versions, each a
``ServableVersion`` with TF Serving's states ``START`` -> ``LOADING`` ->
``AVAILABLE`` -> ``UNLOADING`` -> ``END`` (a version that failed to load
ends in ``END`` with its error). It polls each ``base_path`` for integer
version folders holding a ``saved_model.pb``, applies the version policy
(``latest`` (default: the newest 1), ``all``, or ``specific`` versions) and
loads a new version before it unloads the one it replaces, so requests keep
being answered across a version change; a version being unloaded first
finishes the requests it already has.
"""

import logging
import pathlib
import threading
import time

import numpy as np

from keras_trm.export.warmup import read_warmup_requests, warmup_path
from keras_trm.serving.batching import BatchScheduler
from keras_trm.serving.errors import (
    InvalidArgument, NotFound, ServingError, Unavailable, check_input_names,
    from_tf_error)

log = logging.getLogger("keras_trm.serving")

STATES = ("START", "LOADING", "AVAILABLE", "UNLOADING", "END")
MAX_LOAD_ATTEMPTS = 3


def _spec_shape(spec):
    return None if spec.shape.rank is None else spec.shape.as_list()


class ServableVersion:
    """One version folder of a model: loading, state, signatures, predict.

    Args:
        name: the model's name.
        version: int.
        path: the SavedModel folder ``<base_path>/<version>``.

    Attributes:
        state: one of ``START``, ``LOADING``, ``AVAILABLE``, ``UNLOADING``,
            ``END``.
        error: why the version ended without loading ("" if it did not).
        signature_defs: ``{name: SignatureDef}`` protos read from
            ``saved_model.pb`` (what TF Serving's metadata returns).
        warmup_requests: how many requests of the SavedModel's warm-up file
            (``assets.extra/tf_serving_warmup_requests``) were replayed at
            load, as TF Serving does before a version is ``AVAILABLE``
            (e.g. to compile an XLA search before the first client).
        warmup_seconds: the time they took.
    """

    def __init__(self, name, version, path):
        self.name = name
        self.version = int(version)
        self.path = pathlib.Path(path)
        self.state = "START"
        self.error = ""
        self.signature_defs = {}
        self.warmup_requests = 0
        self.warmup_seconds = 0.0
        self._signatures = {}
        self._input_specs = {}
        self._batchable = {}
        self._loaded = None
        self._batcher = None
        self.in_flight = 0

    # -- lifecycle --------------------------------------------------------------
    def load(self, batching=None):
        """Loads the SavedModel (state ``LOADING`` -> ``AVAILABLE``).

        Args:
            batching: ``BatchingOptions`` to batch concurrent requests, or None.

        Raises:
            Exception: whatever ``tf.saved_model.load`` raised; the state is
                then ``END`` and ``error`` says why.
        """
        import tensorflow as tf

        try:
            import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
        except ImportError:  # pragma: no cover - optional
            pass
        from tensorflow.core.protobuf import saved_model_pb2

        self.state = "LOADING"
        try:
            proto = saved_model_pb2.SavedModel.FromString(
                (self.path / "saved_model.pb").read_bytes())
            self.signature_defs = dict(proto.meta_graphs[0].signature_def)
            self._loaded = tf.saved_model.load(str(self.path))
            self._signatures = dict(self._loaded.signatures)
            for key, function in self._signatures.items():
                specs = function.structured_input_signature[1]
                outputs = function.structured_outputs
                self._input_specs[key] = specs
                shapes = [_spec_shape(s) for s in list(specs.values())
                          + list(outputs.values())]
                self._batchable[key] = bool(specs) and all(
                    shape and shape[0] is None for shape in shapes)
            self._warm_up()
            if batching is not None:
                self._batcher = BatchScheduler(
                    self._call, batching, name=f"{self.name}/{self.version}")
        except Exception as err:
            self.state = "END"
            self.error = f"{type(err).__name__}: {err}"
            self._loaded = None
            self._signatures = {}
            raise
        self.state = "AVAILABLE"

    def _warm_up(self):
        """Replays the warm-up file's requests (if any) through the loaded
        signatures; a request that fails fails the load, as in TF Serving."""
        path = warmup_path(self.path)
        if not path.exists():
            return
        start = time.perf_counter()
        requests = read_warmup_requests(path)
        for i, (signature_name, inputs) in enumerate(requests):
            function = self._signatures.get(signature_name)
            if function is None:
                raise ValueError(
                    f"warm-up request {i} of {str(path)!r} names signature "
                    f"{signature_name!r}; the model has {self.signature_names}")
            try:
                function(**inputs)
            except Exception as err:
                raise ValueError(f"warm-up request {i} of {str(path)!r} failed: "
                                 f"{type(err).__name__}: {err}") from err
        self.warmup_requests = len(requests)
        self.warmup_seconds = time.perf_counter() - start
        log.info("model %r version %d: %d warm-up requests replayed in %.1f s",
                 self.name, self.version, self.warmup_requests,
                 self.warmup_seconds)

    def unload(self):
        """Stops batching and drops the SavedModel (state -> ``END``)."""
        self.state = "UNLOADING"
        if self._batcher is not None:
            self._batcher.stop()
            stats = self._batcher.stats
            if stats["batches"]:
                log.info("model %r version %d batching: %d requests in %d batches "
                         "(%.2f rows per batch)", self.name, self.version,
                         stats["tasks"], stats["batches"],
                         stats["rows"] / stats["batches"])
            self._batcher = None
        self._signatures = {}
        self._loaded = None
        self.state = "END"

    # -- serving ----------------------------------------------------------------
    @property
    def batch_stats(self):
        """``{"batches", "tasks", "rows"}`` run by the batch scheduler so far."""
        return dict(self._batcher.stats) if self._batcher is not None else {}

    @property
    def signature_names(self):
        return sorted(self._signatures)

    def input_specs(self, signature_name):
        """``{input name: tf.TensorSpec}`` of a signature.

        Raises:
            NotFound: no signature of that name.
        """
        if signature_name not in self._signatures:
            raise NotFound(
                f"Serving signature name: {signature_name!r} not found in signature "
                f"def of model {self.name!r} version {self.version}; available: "
                f"{self.signature_names}")
        return self._input_specs[signature_name]

    def predict(self, signature_name, inputs, output_filter=()):
        """Runs a signature on numpy inputs (batched if batching is on).

        Args:
            signature_name: str, e.g. ``"serving_default"``.
            inputs: ``{name: np.ndarray}`` of exactly the signature's inputs,
                each of the signature's dtype (strings as ``object`` arrays
                of ``bytes``) and a shape compatible with its spec.
            output_filter: names of the outputs to return (default: all).

        Returns:
            ``{output name: np.ndarray}``.

        Raises:
            NotFound: unknown signature.
            InvalidArgument: missing or unknown inputs, a wrong dtype or
                shape, an unknown output in ``output_filter``, or the
                signature refusing the values (``InvalidArgumentError``).
            Unavailable: the batch queue is full.
            ServingError: any other TensorFlow error, with its code.
        """
        specs = self.input_specs(signature_name)
        check_input_names(specs, inputs, signature_name)
        for key, value in inputs.items():
            spec = specs[key]
            want = np.dtype(object) if spec.dtype.name == "string" else np.dtype(
                spec.dtype.as_numpy_dtype)
            if value.dtype != want:
                raise InvalidArgument(
                    f"input {key!r} expects dtype {spec.dtype.name}, got {value.dtype}")
            if not spec.shape.is_compatible_with(value.shape):
                raise InvalidArgument(
                    f"input {key!r}: shape {list(value.shape)} does not match the "
                    f"signature's {_spec_shape(spec)} (None = any size)")
        outputs_all = self._signatures[signature_name].structured_outputs
        unknown = sorted(set(output_filter) - set(outputs_all))
        if unknown:
            raise InvalidArgument(
                f"output_filter names unknown outputs {unknown}; signature "
                f"{signature_name!r} has {sorted(outputs_all)}")
        sizes = {int(v.shape[0]) for v in inputs.values()}
        if (self._batcher is not None and self._batchable[signature_name]
                and len(sizes) == 1 and min(sizes) > 0):
            outputs = self._batcher.schedule(signature_name, inputs)
        else:
            outputs = self._call(signature_name, inputs)
        if output_filter:
            outputs = {k: outputs[k] for k in output_filter}
        return outputs

    def _call(self, signature_name, inputs):
        import tensorflow as tf

        function = self._signatures.get(signature_name)
        if function is None:
            raise Unavailable(
                f"model {self.name!r} version {self.version} is unloading; retry")
        try:
            outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
            return {k: v.numpy() for k, v in outputs.items()}
        except tf.errors.OpError as err:
            error = from_tf_error(err)
            if error.code == "INVALID_ARGUMENT":
                raise InvalidArgument(str(error)) from err
            raise error from err


class _Model:
    def __init__(self, config):
        self.config = config
        self.name = config.name
        self.base_path = pathlib.Path(config.base_path)
        self.versions = {}  # int -> ServableVersion (END ones kept for status)
        self.attempts = {}  # int -> failed load attempts

    def found_versions(self):
        if not self.base_path.is_dir():
            return []
        return sorted(int(p.name) for p in self.base_path.iterdir()
                      if p.name.isdigit() and (p / "saved_model.pb").is_file())

    def aspired(self, found):
        policy = self.config.model_version_policy
        which = policy.WhichOneof("policy_choice")
        if which == "all":
            return list(found)
        if which == "specific":
            return [v for v in found if v in set(policy.specific.versions)]
        n = policy.latest.num_versions if which == "latest" else 1
        return list(found[-max(n, 1):])


class ModelManager:
    """Loads, serves and unloads the versions of every configured model.

    Args:
        config: ``ModelServerConfig`` (see ``keras_trm.serving.config``).
        batching: ``BatchingOptions`` to batch requests, or None.
        file_system_poll_wait_seconds: seconds between scans of the base
            paths for new versions (TF Serving's flag: 0 scans once at
            start, a negative value never).

    Raises:
        FileNotFoundError: (``start``) a base path is not a folder.

    Example:
        >>> manager = ModelManager(model_server_config([], ["export/imdb_encoder"]))
        >>> manager.start()
        >>> with manager.acquire("imdb_encoder") as servable:
        ...     servable.predict("serving_default", {"reviews": reviews})
    """

    def __init__(self, config, batching=None, file_system_poll_wait_seconds=1.0):
        self.batching = batching
        self.poll_wait = float(file_system_poll_wait_seconds)
        self._models = {m.name: _Model(m) for m in config.model_config_list.config}
        self._cond = threading.Condition()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._poller = None
        self.started = False

    @property
    def model_names(self):
        return sorted(self._models)

    def start(self):
        """First scan and load (blocking), then polling in a thread."""
        for model in self._models.values():
            if not model.base_path.is_dir():
                raise FileNotFoundError(
                    f"`model_base_path` {str(model.base_path)!r} of model "
                    f"{model.name!r} is not a folder")
        self.started = True
        self.refresh()
        if self.poll_wait > 0:
            self._poller = threading.Thread(target=self._poll, name="version-poller",
                                            daemon=True)
            self._poller.start()

    def _poll(self):
        while not self._stop.wait(self.poll_wait):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - keep polling
                log.exception("scanning the model base paths failed")

    def refresh(self):
        """One scan: load aspired versions, then unload the ones they replace."""
        with self._refresh_lock:
            for model in self._models.values():
                self._refresh_model(model)

    def _refresh_model(self, model):
        found = model.found_versions()
        aspired = model.aspired(found)
        for version in aspired:
            current = model.versions.get(version)
            if current is not None and current.state in ("LOADING", "AVAILABLE"):
                continue
            if model.attempts.get(version, 0) >= MAX_LOAD_ATTEMPTS:
                continue
            servable = ServableVersion(model.name, version, model.base_path / str(version))
            with self._cond:
                model.versions[version] = servable
            started = time.monotonic()
            try:
                servable.load(self.batching)
            except Exception:  # noqa: BLE001 - reported in the status
                model.attempts[version] = model.attempts.get(version, 0) + 1
                log.exception("model %r version %d failed to load", model.name, version)
                continue
            log.info("model %r version %d AVAILABLE (loaded in %.1f s)", model.name,
                     version, time.monotonic() - started)
        with self._cond:
            available = [v for v, s in model.versions.items() if s.state == "AVAILABLE"]
            if found and not any(v in aspired for v in available):
                return  # keep serving the old versions until a new one is up
            retiring = [model.versions[v] for v in available if v not in aspired]
            for servable in retiring:
                servable.state = "UNLOADING"  # no new requests from here on
        for servable in retiring:
            with self._cond:
                self._cond.wait_for(lambda s=servable: s.in_flight == 0, timeout=120)
            servable.unload()
            log.info("model %r version %d unloaded", model.name, servable.version)

    def stop(self):
        """Stops polling and unloads every version."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        with self._refresh_lock:
            for model in self._models.values():
                for servable in list(model.versions.values()):
                    if servable.state == "AVAILABLE":
                        servable.unload()

    # -- lookups ----------------------------------------------------------------
    def _model(self, name):
        model = self._models.get(name)
        if model is None:
            raise NotFound(f"Servable not found for request: model {name!r} is not "
                           f"served; models: {self.model_names}")
        return model

    def resolve_version(self, name, version=None, label=None):
        """The version number a request means (latest available if neither).

        Raises:
            NotFound: unknown model, label or version, or nothing available.
        """
        model = self._model(name)
        if label:
            labels = dict(model.config.version_labels)
            if label not in labels:
                raise NotFound(f"Unrecognized servable version label: {label!r} for "
                               f"model {name!r}; labels: {sorted(labels)}")
            return int(labels[label])
        if version is not None:
            return int(version)
        available = [v for v, s in model.versions.items() if s.state == "AVAILABLE"]
        if not available:
            raise NotFound(f"Servable not found for request: Latest({name}); no "
                           "version is available")
        return max(available)

    def acquire(self, name, version=None, label=None):
        """Context manager yielding an ``AVAILABLE`` ``ServableVersion``.

        While held, the version is not unloaded.

        Raises:
            NotFound: unknown model, version or label, or that version not
                available.
        """
        return _Lease(self, name, version, label)

    def status(self, name, version=None, label=None):
        """``[(version, state, error_message)]`` newest first.

        Raises:
            NotFound: unknown model, or a version it never had.
        """
        model = self._model(name)
        with self._cond:
            if version is None and not label:
                items = sorted(model.versions.items(), reverse=True)
            else:
                number = self.resolve_version(name, version, label)
                if number not in model.versions:
                    raise NotFound(f"Could not find version {number} of model {name!r}")
                items = [(number, model.versions[number])]
            return [(v, s.state, s.error) for v, s in items]

    def ready(self):
        """True when every model has an ``AVAILABLE`` version."""
        with self._cond:
            return all(any(s.state == "AVAILABLE" for s in m.versions.values())
                       for m in self._models.values())


class _Lease:
    def __init__(self, manager, name, version, label):
        self.manager = manager
        self.args = (name, version, label)
        self.servable = None

    def __enter__(self):
        manager = self.manager
        name, version, label = self.args
        with manager._cond:
            number = manager.resolve_version(name, version, label)
            servable = manager._model(name).versions.get(number)
            if servable is None or servable.state != "AVAILABLE":
                state = "never seen" if servable is None else servable.state
                raise NotFound(f"Servable not found for request: Specific({name}, "
                               f"{number}) (version state: {state})")
            servable.in_flight += 1
        self.servable = servable
        return servable

    def __exit__(self, *exc):
        with self.manager._cond:
            self.servable.in_flight -= 1
            self.manager._cond.notify_all()
        return False


__all__ = ["ModelManager", "ServableVersion", "STATES", "ServingError"]
