"""TF Serving's configuration files: ``ModelServerConfig`` and
``BatchingParameters``, both in protobuf text format.

A model config file (``--model_config_file``) as TF Serving reads it::

    model_config_list {
      config {
        name: "translator"
        base_path: "/models/transformer_multi30k_en_de"
        model_platform: "tensorflow"
        model_version_policy { latest { num_versions: 2 } }  # or all {} /
                                             # specific { versions: 1 versions: 3 }
        version_labels { key: "stable" value: 1 }
      }
      config { name: "imdb" base_path: "/models/imdb_encoder" }
    }

A batching parameters file (``--batching_parameters_file``)::

    max_batch_size { value: 32 }
    batch_timeout_micros { value: 2000 }
    num_batch_threads { value: 2 }
    max_enqueued_batches { value: 100 }
    allowed_batch_sizes: 8
    allowed_batch_sizes: 32
"""

import pathlib

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from keras_trm.serving.batching import BatchingOptions



def _parse_text_proto(path, message, argument):
    """Fills ``message`` from the text-format protobuf file ``path``;
    a ``ValueError`` names the flag ``argument``, the file and the parse
    error."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"`{argument}` {str(path)!r} is not UTF-8 text: {err}") from None
    except OSError as err:  # missing, a folder, unreadable
        raise ValueError(f"`{argument}` {str(path)!r} cannot be read: "
                         f"{err.strerror or err}") from None
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as err:
        raise ValueError(
            f"`{argument}` {str(path)!r} is not a text "
            f"{type(message).__name__}: {err}") from err

def _config_pb2():
    from tensorflow_serving.config import model_server_config_pb2

    return model_server_config_pb2


def model_server_config(model_names=(), model_base_paths=(), model_config_file=None):
    """A ``ModelServerConfig`` from flags or a config file.

    Args:
        model_names: names given with ``--model_name`` (one per base path;
            a missing name is the base path's folder name).
        model_base_paths: folders of versions given with
            ``--model_base_path`` (repeat both flags for several models).
        model_config_file: path of a text ``ModelServerConfig`` (exclusive
            with the two flags above).

    Returns:
        ``tensorflow_serving.config.model_server_config_pb2.ModelServerConfig``
        with a ``model_config_list``; base paths are made absolute.

    Raises:
        ValueError: neither or both of the two ways, more names than base
            paths, a duplicated name, a config without ``model_config_list``
            or a text proto that does not parse (naming the file).
    """
    pb2 = _config_pb2()
    model_names = list(model_names or ())
    model_base_paths = [str(p) for p in (model_base_paths or ())]
    if model_config_file and (model_names or model_base_paths):
        raise ValueError(
            "give either `model_config_file` or `model_name`/`model_base_path`, "
            f"not both (model_config_file={str(model_config_file)!r}, "
            f"model_base_path={model_base_paths})")
    config = pb2.ModelServerConfig()
    if model_config_file:
        path = pathlib.Path(model_config_file)
        _parse_text_proto(path, config, "model_config_file")
        if not config.HasField("model_config_list"):
            raise ValueError(
                f"`model_config_file` {str(path)!r} has no model_config_list")
        base_dir = path.resolve().parent
        for model in config.model_config_list.config:
            if not model.base_path:
                raise ValueError(
                    f"`model_config_file` {str(path)!r}: model {model.name!r} has "
                    "no base_path")
            if not pathlib.Path(model.base_path).is_absolute():
                model.base_path = str(base_dir / model.base_path)
    else:
        if not model_base_paths:
            raise ValueError("give `model_base_path` (with `model_name`) or "
                             "`model_config_file`")
        if len(model_names) > len(model_base_paths):
            raise ValueError(
                f"each `model_name` needs a `model_base_path`, got "
                f"model_name={model_names}, model_base_path={model_base_paths}")
        for i, base in enumerate(model_base_paths):
            model = config.model_config_list.config.add()
            model.base_path = str(pathlib.Path(base).resolve())
            model.name = model_names[i] if i < len(model_names) else pathlib.Path(
                base).resolve().name
            model.model_platform = "tensorflow"
    for model in config.model_config_list.config:
        if not model.name:
            model.name = pathlib.Path(model.base_path).name
        if not model.name or "/" in model.name or ":" in model.name:
            # The REST paths /v1/models/<name>[:verb] cannot name it.
            raise ValueError(
                f"model name {model.name!r} (base path {model.base_path!r}) must "
                "be non-empty, without '/' or ':', which the REST API's paths "
                "cannot hold")
        if model.model_platform not in ("", "tensorflow"):
            raise ValueError(
                f"model {model.name!r}: model_platform={model.model_platform!r}; "
                "this server serves 'tensorflow' SavedModels only")
    names = [m.name for m in config.model_config_list.config]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"model names must be unique, got {duplicated} more than once")
    return config


# TF Serving's BatchingParameters (session_bundle_config.proto), declared here
# because the tensorflow-serving-api package does not ship that proto. Field
# numbers do not matter to the text format; names and types do.
_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_BATCHING_FIELDS = [
    ("max_batch_size", _MESSAGE, ".google.protobuf.Int64Value"),
    ("batch_timeout_micros", _MESSAGE, ".google.protobuf.Int64Value"),
    ("max_enqueued_batches", _MESSAGE, ".google.protobuf.Int64Value"),
    ("num_batch_threads", _MESSAGE, ".google.protobuf.Int64Value"),
    ("thread_pool_name", _MESSAGE, ".google.protobuf.StringValue"),
    ("allowed_batch_sizes", _INT64, None),
    ("pad_variable_length_inputs", _BOOL, None),
    ("enable_large_batch_splitting", _MESSAGE, ".google.protobuf.BoolValue"),
    ("max_execution_batch_size", _MESSAGE, ".google.protobuf.Int64Value"),
]
_batching_cls = None


def _batching_parameters_class():
    global _batching_cls
    if _batching_cls is None:
        from google.protobuf import wrappers_pb2

        pool = descriptor_pool.DescriptorPool()
        wrappers = descriptor_pb2.FileDescriptorProto()
        wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
        pool.Add(wrappers)
        proto = descriptor_pb2.FileDescriptorProto(
            name="keras_trm_batching_parameters.proto", package="tensorflow.serving",
            dependency=[wrappers.name], syntax="proto3")
        message = proto.message_type.add(name="BatchingParameters")
        for number, (name, kind, type_name) in enumerate(_BATCHING_FIELDS, start=1):
            field = message.field.add(
                name=name, number=number, type=kind,
                label=_REPEATED if name == "allowed_batch_sizes" else _OPTIONAL)
            if type_name:
                field.type_name = type_name
        pool.Add(proto)
        _batching_cls = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))
    return _batching_cls


def batching_options(batching_parameters_file=None):
    """``BatchingOptions`` from a text ``BatchingParameters`` file.

    Args:
        batching_parameters_file: path, or None for TF Serving's defaults
            (max_batch_size 1000, batch_timeout_micros 0, num_batch_threads
            = CPU cores, max_enqueued_batches 100).

    Raises:
        ValueError: the file does not parse, sets a field this server does
            not implement (``pad_variable_length_inputs``,
            ``enable_large_batch_splitting``), or a value is out of range.
    """
    if batching_parameters_file is None:
        return BatchingOptions()
    path = pathlib.Path(batching_parameters_file)
    params = _batching_parameters_class()()
    _parse_text_proto(path, params, "batching_parameters_file")
    if params.pad_variable_length_inputs or params.enable_large_batch_splitting.value:
        raise ValueError(
            f"`batching_parameters_file` {str(path)!r}: pad_variable_length_inputs "
            "and enable_large_batch_splitting are not supported by this server")
    kwargs = {}
    for name in ("max_batch_size", "batch_timeout_micros", "num_batch_threads",
                 "max_enqueued_batches"):
        if params.HasField(name):
            kwargs[name] = int(getattr(params, name).value)
    if params.allowed_batch_sizes:
        kwargs["allowed_batch_sizes"] = tuple(params.allowed_batch_sizes)
    try:
        return BatchingOptions(**kwargs)
    except ValueError as err:
        raise ValueError(f"`batching_parameters_file` {str(path)!r}: {err}") from err


def configure_tensorflow_threads(intra_op=0, inter_op=0, session=0):
    """Sets TensorFlow's thread pools as ``tensorflow_model_server`` does
    with ``--tensorflow_intra_op_parallelism``,
    ``--tensorflow_inter_op_parallelism`` and
    ``--tensorflow_session_parallelism`` (0 = TensorFlow's own choice, one
    thread per core; ``session`` sets both pools where the other two are 0).
    Call it before the first TensorFlow op of the process.

    With many concurrent requests of small ops (a beam search step is
    hundreds of them), one thread per op (``intra_op=1``) and the requests
    spread over ``inter_op`` threads keep the cores busier than splitting
    each small op across all cores (``bench/bench_serving.py`` at 32da1ca measures
    it; figures in docs/measurements.md).

    Args:
        intra_op, inter_op, session: ints >= 0, threads.

    Returns:
        ``{"intra_op": int, "inter_op": int}``: the sizes TensorFlow now
        reports (0 = its default).

    Raises:
        ValueError: a negative or non-int value, naming the flag.
        RuntimeError: TensorFlow already ran an op in this process.

    Example:
        >>> configure_tensorflow_threads(intra_op=-1)
        Traceback (most recent call last):
        ...
        ValueError: --tensorflow_intra_op_parallelism must be an int >= 0, got -1
    """
    for flag, value in (("intra_op", intra_op), ("inter_op", inter_op),
                        ("session", session)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"--tensorflow_{flag}_parallelism must be an int >= 0, "
                             f"got {value!r}")
    if session and not intra_op and not inter_op:
        intra_op = inter_op = session
    import tensorflow as tf

    threading = tf.config.threading
    if intra_op and threading.get_intra_op_parallelism_threads() != intra_op:
        threading.set_intra_op_parallelism_threads(intra_op)
    if inter_op and threading.get_inter_op_parallelism_threads() != inter_op:
        threading.set_inter_op_parallelism_threads(inter_op)
    return {"intra_op": threading.get_intra_op_parallelism_threads(),
            "inter_op": threading.get_inter_op_parallelism_threads()}
