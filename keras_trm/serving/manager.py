"""Models and versions as TF Serving manages them.

``ModelManager`` holds every configured model's versions, each a
``ServableVersion`` in TF Serving's states (``STATES``; one that failed to
load ends in ``END`` with its error). It polls each ``base_path`` for
integer version folders holding a ``saved_model.pb``, applies the version
policy (``latest`` (default: the newest 1), ``all`` or ``specific``) and
loads a new version before it unloads the one it replaces, which first
finishes its requests. A version is prepared off the request path before
it is ``AVAILABLE`` (issue #38; ``ServableVersion.load``).
"""

import concurrent.futures
import contextlib
import importlib
import logging
import os
import pathlib
import re
import threading
import time

import numpy as np

from keras_trm.export.warmup import read_warmup_requests, warmup_path
from keras_trm.serving.batching import BatchScheduler
from keras_trm.serving.errors import (
    InvalidArgument, NotFound, ServingError, Unavailable, check_input_names,
    from_tf_error)
from keras_trm.utils.memory import release_freed_memory

log = logging.getLogger("keras_trm.serving")

STATES = ("START", "LOADING", "AVAILABLE", "UNLOADING", "END")
MAX_LOAD_ATTEMPTS = 3
# Ops that change state (variables, tables, files): a signature holding one
# is not called with made-up inputs at load.
_WRITE_OPS = re.compile(
    r"^(Assign|ResourceScatter|ResourceApply|ResourceSparseApply|"
    r"ResourceStridedSliceAssign|LookupTable(Insert|Remove|Import)|"
    r"InitializeTable|WriteFile|Save|MergeV2Checkpoints|Enqueue|QueueEnqueue|"
    r"StackPush|Write(Scalar|Histogram|Image|Audio|Graph|Raw|Summary))")


def _spec_shape(spec):
    return None if spec.shape.rank is None else spec.shape.as_list()


def writes_state(function):
    """True if a loaded concrete function, or one it calls, holds an op
    writing a variable, a table or a file (``_WRITE_OPS``)."""
    graph_def = function.graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return any(_WRITE_OPS.match(node.op) for node in nodes)


def minimal_inputs(specs):
    """One row of zeros (empty strings for string inputs) per input spec,
    every unknown dimension 1; None if an input's rank is unknown.

    Example:
    >>> import tensorflow as tf
    >>> inputs = minimal_inputs({"text": tf.TensorSpec([None], tf.string),
    ...                          "x": tf.TensorSpec([None, 2], tf.float32)})
    >>> {k: (v.dtype.name, v.shape.as_list()) for k, v in inputs.items()}
    {'text': ('string', [1]), 'x': ('float32', [1, 2])}
    """
    import tensorflow as tf

    if any(spec.shape.rank is None for spec in specs.values()):
        return None
    shapes = {k: [1 if d is None else d for d in s.shape.as_list()] for k, s in specs.items()}
    return {k: tf.fill(shapes[k], "") if s.dtype == tf.string else tf.zeros(shapes[k], s.dtype)
            for k, s in specs.items()}


def _lower_thread_priority(niceness):
    """Raises the calling thread's (Linux: per-thread) nice value by
    ``niceness``, where the OS allows it."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(current + niceness, 19))


class ServableVersion:
    """Version ``version`` (int) of model ``name``, the SavedModel folder
    ``path`` (``<base_path>/<version>``): loading, state, signatures, predict.

    Attributes:
        state: one of ``STATES``; ``error``: why it ended without loading.
        signature_defs: ``{name: SignatureDef}`` from ``saved_model.pb``.
        warmup_requests: how many requests of the warm-up file
            (``assets.extra/tf_serving_warmup_requests``) were replayed.
        warmed_signatures: those called at load with one minimal row.
        warmup_seconds, restore_seconds, prepare_seconds, load_seconds: the
            time of the warm-up file's requests, of ``tf.saved_model.load``,
            of the minimal-row calls and of the whole load.
    """

    def __init__(self, name, version, path):
        self.name = name
        self.version = int(version)
        self.path = pathlib.Path(path)
        self.state = "START"
        self.error = ""
        self.warmup_requests = 0
        self.warmed_signatures = []
        self.warmup_seconds = self.restore_seconds = 0.0
        self.prepare_seconds = self.load_seconds = 0.0
        self._called = set()  # signatures whose function ran once
        self.in_flight = 0
        self._drop()

    def _drop(self):
        """Drops the loaded objects (freed once nothing else refers to them)."""
        self._loaded = self._batcher = None
        self._signatures, self._input_specs, self._batchable = {}, {}, {}
        self._first_call_locks, self.signature_defs = {}, {}

    def load(self, batching=None, warm_up_signatures=True, niceness=0):
        """Loads the SavedModel (state ``LOADING`` -> ``AVAILABLE``).

        TensorFlow instantiates a signature's function at its first call
        (~3 s for a beam search), and 16 requests reaching a new version at
        once each did it (up to 60 s, ~1.1 GB; ``bench/bench_version_swap.py``
        at 32da1ca). So before the version is ``AVAILABLE`` the warm-up
        file's requests are replayed (as TF Serving does) and, with
        ``warm_up_signatures``, each signature they did not call is called
        with one minimal row (``minimal_inputs``) unless it writes state
        (``writes_state``) or an input's rank is unknown; a signature still
        not called runs its first call alone.

        Args:
            batching: ``BatchingOptions`` to batch concurrent requests, or None.
            warm_up_signatures: bool, as above (False: the old behaviour).
            niceness: int >= 0; > 0 runs the warm-up calls in a thread of that
                much lower OS priority (Linux nice). ``tf.saved_model.load``
                stays at the caller's: it holds the interpreter, which a
                low-priority thread would hold for long (2.6 s gaps at nice
                10, docs/serving.md).

        Raises:
            Exception: whatever the load raised; the state is then ``END``
                and ``error`` says why.
        """
        from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

        self.state = "LOADING"
        start = time.perf_counter()
        try:
            proto = saved_model_pb2.SavedModel.FromString(
                (self.path / "saved_model.pb").read_bytes())
            # Copies: a sub-message keeps its whole parsed SavedModel alive.
            self.signature_defs = {
                key: meta_graph_pb2.SignatureDef.FromString(sig.SerializeToString())
                for key, sig in proto.meta_graphs[0].signature_def.items()}
            del proto
            self._restore(warm_up_signatures)
            self._prepare(warm_up_signatures, niceness)
            if batching is not None:
                self._batcher = BatchScheduler(
                    self._call, batching, name=f"{self.name}/{self.version}")
        except Exception as err:
            self.state = "END"
            self.error = f"{type(err).__name__}: {err}"
            self._drop()
            raise
        self.load_seconds = time.perf_counter() - start
        self.state = "AVAILABLE"

    def _prepare(self, warm_up_signatures, niceness):
        if niceness > 0:
            from tensorflow.python.eager import context

            # TensorFlow's thread pools are created with its context, and a
            # thread inherits its creator's priority: create them here first.
            context.ensure_initialized()
            with concurrent.futures.ThreadPoolExecutor(
                    1, f"load-{self.name}-{self.version}", _lower_thread_priority,
                    (niceness,)) as pool:
                return pool.submit(self._prepare, warm_up_signatures, 0).result()
        self._warm_up()
        if warm_up_signatures:
            self._warm_up_signatures()

    def _restore(self, warm_up_signatures):
        import tensorflow as tf

        with contextlib.suppress(ImportError):  # registers the tokenizer ops
            importlib.import_module("tensorflow_text")
        start = time.perf_counter()
        self._loaded = tf.saved_model.load(str(self.path))
        self._signatures = dict(self._loaded.signatures)
        self.restore_seconds = time.perf_counter() - start
        for key, function in self._signatures.items():
            specs = self._input_specs[key] = function.structured_input_signature[1]
            shapes = [_spec_shape(s) for s in [*specs.values(),
                                               *function.structured_outputs.values()]]
            self._batchable[key] = bool(specs) and all(
                shape and shape[0] is None for shape in shapes)
            if warm_up_signatures:
                self._first_call_locks[key] = threading.Lock()

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
                raise ValueError(f"warm-up request {i} of {str(path)!r} names signature "
                                 f"{signature_name!r}; the model has {self.signature_names}")
            try:
                function(**inputs)
            except Exception as err:
                raise ValueError(f"warm-up request {i} of {str(path)!r} failed: "
                                 f"{type(err).__name__}: {err}") from err
            self._called.add(signature_name)
            time.sleep(0)  # let the serving threads have the interpreter
        self.warmup_requests = len(requests)
        self.warmup_seconds = time.perf_counter() - start

    def _warm_up_signatures(self):
        """Calls each signature not called yet once with one minimal row, so
        that TensorFlow instantiates its function now."""
        import tensorflow as tf

        start = time.perf_counter()
        for key, function in sorted(self._signatures.items()):
            if key in self._called:
                continue
            try:
                inputs = minimal_inputs(self._input_specs[key])
                skip = ("an input of unknown rank" if inputs is None else
                        "it writes state" if writes_state(function) else None)
                if not skip:
                    function(**inputs)
            except tf.errors.OpError as err:
                # It ran (so it is instantiated) and refused the made-up row.
                log.debug("signature %r refused the minimal row: %s", key, err)
            except Exception as err:  # noqa: BLE001 - e.g. an unusual dtype
                skip = f"{type(err).__name__}: {err}"
            if skip:
                log.info("model %r version %d: signature %r is not called at load (%s); "
                         "its first request runs alone", self.name, self.version, key, skip)
                continue
            self._called.add(key)
            self.warmed_signatures.append(key)
            time.sleep(0)
        self.prepare_seconds = time.perf_counter() - start

    def unload(self):
        """Stops batching and drops the SavedModel (state -> ``END``)."""
        self.state = "UNLOADING"
        if self._batcher is not None:
            self._batcher.stop()
            stats = self._batcher.stats
            if stats["batches"]:
                log.info("model %r version %d batching: %d requests in %d batches "
                         "(%.2f rows per batch)", self.name, self.version, stats["tasks"],
                         stats["batches"], stats["rows"] / stats["batches"])
        self._drop()
        self.state = "END"

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
            raise NotFound(f"Serving signature name: {signature_name!r} not found in "
                           f"signature def of model {self.name!r} version {self.version}; "
                           f"available: {self.signature_names}")
        return self._input_specs[signature_name]

    def predict(self, signature_name, inputs, output_filter=()):
        """Runs a signature on numpy inputs (batched if batching is on).

        ``inputs`` are ``{name: np.ndarray}`` of exactly the signature's
        inputs, of its dtypes (strings as ``object`` arrays of ``bytes``)
        and shapes; ``output_filter`` names the outputs to return (default:
        all). Returns ``{output name: np.ndarray}``.

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
            want = np.dtype(object if spec.dtype.name == "string" else spec.dtype.as_numpy_dtype)
            if value.dtype != want:
                raise InvalidArgument(
                    f"input {key!r} expects dtype {spec.dtype.name}, got {value.dtype}")
            if not spec.shape.is_compatible_with(value.shape):
                raise InvalidArgument(f"input {key!r}: shape {list(value.shape)} does not match "
                                      f"the signature's {_spec_shape(spec)} (None = any size)")
        outputs_all = self._signatures[signature_name].structured_outputs
        unknown = sorted(set(output_filter) - set(outputs_all))
        if unknown:
            raise InvalidArgument(f"output_filter names unknown outputs {unknown}; signature "
                                  f"{signature_name!r} has {sorted(outputs_all)}")
        sizes = {int(v.shape[0]) for v in inputs.values()}
        if (self._batcher is not None and self._batchable[signature_name]
                and len(sizes) == 1 and min(sizes) > 0):
            outputs = self._batcher.schedule(signature_name, inputs)
        else:
            outputs = self._call(signature_name, inputs)
        return {k: outputs[k] for k in output_filter} if output_filter else outputs

    def _call(self, signature_name, inputs):
        function = self._signatures.get(signature_name)
        if function is None:
            raise Unavailable(f"model {self.name!r} version {self.version} is unloading; retry")
        lock = self._first_call_locks.get(signature_name)
        if lock is not None and signature_name not in self._called:
            # Concurrent first calls would each instantiate the function:
            # the others wait for the first, then run side by side.
            with lock:
                if signature_name not in self._called:
                    return self._run(function, signature_name, inputs)
        return self._run(function, signature_name, inputs)

    def _run(self, function, signature_name, inputs):
        import tensorflow as tf

        try:
            outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
        except tf.errors.OpError as err:
            self._called.add(signature_name)  # it ran, and refused the inputs
            raise from_tf_error(err) from err
        self._called.add(signature_name)
        return {k: v.numpy() for k, v in outputs.items()}


def _folder_identity(folder):
    """What changes when a version folder is replaced or rewritten: the
    folder's and its saved_model.pb's inode, size and modification time."""
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in (
            os.stat(folder), os.stat(pathlib.Path(folder) / "saved_model.pb")))
    except (OSError, TypeError):  # TypeError: no folder (None)
        return None


class _Model:
    def __init__(self, config):
        self.config = config
        self.name = config.name
        self.base_path = pathlib.Path(config.base_path)
        self.versions = {}  # int -> ServableVersion (END ones kept for status)
        # int -> (failed load attempts, _folder_identity): a version folder
        # replaced (a fixed copy) gets its attempts again.
        self.attempts = {}
        self.folders = {}  # int -> its folder (the name as found: 007 too)
        self._warned = None  # the last scan problem logged (logged once)

    def _warn_once(self, message, *args):
        if self._warned != (message, args):
            self._warned = (message, args)
            log.warning(message, *args)

    def found_versions(self):
        """The versions under the base path (ASCII digit folders holding a
        saved_model.pb), sorted; None when the base path is missing (its
        versions are kept, as in TF Serving). Unreadable folders are skipped."""
        try:
            entries = sorted(self.base_path.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            self._warn_once("could not find base path %s of model %r; serving its "
                            "versions loaded so far", str(self.base_path), self.name)
            return None
        folders = {}
        for path in entries:
            name = path.name
            if not (name.isascii() and name.isdigit()):
                continue
            try:
                if not (path / "saved_model.pb").is_file():
                    continue
            except OSError as error:
                self._warn_once("model %r: skipping version folder %s: %s",
                                self.name, str(path), error)
                continue
            if int(name) not in folders or name == str(int(name)):  # "7" wins over "007"
                folders[int(name)] = path
        if not folders:
            self._warn_once("no versions of model %r found under base path %s",
                            self.name, str(self.base_path))
        else:
            self._warned = None
        self.folders = folders
        return sorted(folders)

    def attempts_left(self, version):
        """Whether ``version`` may be (re)tried: fewer than
        MAX_LOAD_ATTEMPTS failures since its folder last changed."""
        count, identity = self.attempts.get(version, (0, None))
        if identity != _folder_identity(self.folders.get(version)):
            self.attempts.pop(version, None)
            return True
        return count < MAX_LOAD_ATTEMPTS

    def failed(self, version):
        count, _ = self.attempts.get(version, (0, None))
        self.attempts[version] = (count + 1, _folder_identity(self.folders.get(version)))

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
        config: ``ModelServerConfig`` (``keras_trm.serving.config``).
        batching: ``BatchingOptions`` to batch requests, or None.
        file_system_poll_wait_seconds: seconds between scans of the base
            paths (TF Serving's flag: 0 scans once at start, < 0 never).
        warm_up_signatures: prepare each version before it is ``AVAILABLE``
            (``ServableVersion.load``); False: the behaviour before #38.
        loader_niceness: int >= 0, how much lower the OS priority (Linux
            nice) of the thread loading a version while others serve is.
        release_memory: after unloading a version, collect garbage and
            return the allocator's free pages (``release_freed_memory``).

    Raises:
        ValueError: ``loader_niceness`` is not an int >= 0.
        FileNotFoundError: (``start``) a base path is not a folder.

    Example:
        >>> manager = ModelManager(model_server_config([], ["export/imdb_encoder"]))
        >>> manager.start()
        >>> with manager.acquire("imdb_encoder") as servable:
        ...     servable.predict("serving_default", {"reviews": reviews})
    """

    def __init__(self, config, batching=None, file_system_poll_wait_seconds=1.0,
                 warm_up_signatures=True, loader_niceness=10, release_memory=True):
        if isinstance(loader_niceness, bool) or not isinstance(loader_niceness, int) or (
                loader_niceness < 0):
            raise ValueError("`loader_niceness` must be an int >= 0, got "
                             f"loader_niceness={loader_niceness!r}")
        self.batching = batching
        self.poll_wait = float(file_system_poll_wait_seconds)
        self.warm_up_signatures = bool(warm_up_signatures)
        self.loader_niceness = loader_niceness
        self.release_memory = bool(release_memory)
        self._models = {m.name: _Model(m) for m in config.model_config_list.config}
        self._cond = threading.Condition()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._poller = None
        self.started = False  # True once start()'s first loads are done

    @property
    def model_names(self):
        return sorted(self._models)

    def start(self):
        """First scan and load (blocking), then polling in a thread."""
        for model in self._models.values():
            if not model.base_path.is_dir():
                raise FileNotFoundError(f"`model_base_path` {str(model.base_path)!r} of model "
                                        f"{model.name!r} is not a folder")
        self.refresh()
        self.started = True
        if self.poll_wait > 0:
            self._poller = threading.Thread(target=self._poll, name="version-poller", daemon=True)
            self._poller.start()

    def _poll(self):
        while not self._stop.wait(self.poll_wait):
            self.refresh()

    def refresh(self):
        """One scan: loads aspired versions, then unloads those they replace."""
        with self._refresh_lock:
            for model in self._models.values():
                try:
                    self._refresh_model(model)
                except Exception:  # noqa: BLE001 - one model never stops the rest
                    log.exception("scanning model %r (base path %s) failed",
                                  model.name, str(model.base_path))

    def _refresh_model(self, model):
        found = model.found_versions()
        if found is None:
            return  # the base path is gone: keep what is served
        aspired = model.aspired(found)
        for version in aspired:
            state = getattr(model.versions.get(version), "state", None)
            if state in ("LOADING", "AVAILABLE") or not model.attempts_left(version):
                continue
            servable = ServableVersion(model.name, version, model.folders[version])
            with self._cond:
                model.versions[version] = servable
            try:
                servable.load(self.batching, self.warm_up_signatures,
                              self.loader_niceness if self.started else 0)
            except Exception:  # noqa: BLE001 - reported in the status
                model.failed(version)
                log.exception("model %r version %d failed to load", model.name, version)
                continue
            log.info("model %r version %d AVAILABLE (loaded in %.1f s: restored in "
                     "%.1f s, %d warm-up requests in %.1f s, %d signatures called "
                     "once in %.1f s)", model.name, version, servable.load_seconds,
                     servable.restore_seconds, servable.warmup_requests,
                     servable.warmup_seconds, len(servable.warmed_signatures),
                     servable.prepare_seconds)
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
            if self.release_memory:
                release_freed_memory()
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

    @contextlib.contextmanager
    def acquire(self, name, version=None, label=None):
        """Context manager yielding an ``AVAILABLE`` ``ServableVersion``,
        not unloaded while held.

        Raises:
            NotFound: unknown model, version or label, or it is not available.
        """
        with self._cond:
            number = self.resolve_version(name, version, label)
            servable = self._model(name).versions.get(number)
            if servable is None or servable.state != "AVAILABLE":
                state = "never seen" if servable is None else servable.state
                raise NotFound(f"Servable not found for request: Specific({name}, "
                               f"{number}) (version state: {state})")
            servable.in_flight += 1
        try:
            yield servable
        finally:
            with self._cond:
                servable.in_flight -= 1
                self._cond.notify_all()

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


__all__ = ["ModelManager", "ServableVersion", "STATES", "ServingError",
           "minimal_inputs", "release_freed_memory", "writes_state"]
