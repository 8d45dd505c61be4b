"""TF Serving's configuration files, in protobuf text format: a model
config (``--model_config_file``)::

    model_config_list {
      config { name: "imdb" base_path: "/models/imdb_encoder" }
      config {
        name: "translator" base_path: "/models/transformer_multi30k_en_de"
        model_version_policy { latest { num_versions: 2 } }  # or all {}, specific {...}
        version_labels { key: "stable" value: 1 }
      }
    }

and batching parameters (``--batching_parameters_file``), e.g.
``max_batch_size { value: 32 } batch_timeout_micros { value: 2000 }``.
"""

import functools
import itertools
import pathlib

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from keras_trm.serving.batching import BatchingOptions

# TF Serving's BatchingParameters (session_bundle_config.proto) and
# MonitoringConfig (monitoring_config.proto), which the tensorflow-serving-api
# package does not ship: {message: [(field, type)]}. Field numbers do not
# matter to the text format; names and types do.
_MESSAGES = {
    "BatchingParameters": [
        ("max_batch_size", "Int64Value"), ("batch_timeout_micros", "Int64Value"),
        ("max_enqueued_batches", "Int64Value"), ("num_batch_threads", "Int64Value"),
        ("thread_pool_name", "StringValue"), ("allowed_batch_sizes", "repeated int64"),
        ("pad_variable_length_inputs", "bool"),
        ("enable_large_batch_splitting", "BoolValue"),
        ("max_execution_batch_size", "Int64Value")],
    "PrometheusConfig": [("enable", "bool"), ("path", "string")],
    "MonitoringConfig": [("prometheus_config", "PrometheusConfig")],
}


@functools.cache
def _message_class(name):
    """The class of ``tensorflow.serving.<name>``, one of ``_MESSAGES``."""
    from google.protobuf import wrappers_pb2

    field_proto = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"keras_trm_{name}.proto", package="tensorflow.serving", syntax="proto3",
        dependency=[wrappers_pb2.DESCRIPTOR.name])
    for message_name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=message_name)
        for number, (field_name, kind) in enumerate(fields, start=1):
            field = message.field.add(name=field_name, number=number,
                                      label=field_proto.LABEL_OPTIONAL)
            if kind.startswith("repeated "):
                field.label, kind = field_proto.LABEL_REPEATED, kind.split()[1]
            if kind[0].islower():
                field.type = field_proto.Type.Value(f"TYPE_{kind.upper()}")
            else:
                field.type = field_proto.TYPE_MESSAGE
                field.type_name = (".google.protobuf." if kind.endswith("Value")
                                   else ".tensorflow.serving.") + kind
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))


def _parse_text_proto(path, message, argument):
    """Fills ``message`` from the text proto file ``path``, or raises a
    ``ValueError`` naming the flag ``argument``, the file and the error."""
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
        raise ValueError(f"`{argument}` {str(path)!r} is not a text {type(message).__name__}: "
                         f"{err}") from err


def model_server_config(model_names=(), model_base_paths=(), model_config_file=None):
    """A ``ModelServerConfig`` from flags or a config file.

    Args:
        model_names: names given with ``--model_name``, one per base path
            (default: the base path's folder name).
        model_base_paths: folders of versions (``--model_base_path``).
        model_config_file: path of a text ``ModelServerConfig``, exclusive
            with the two flags above.

    Returns:
        ``ModelServerConfig`` with a ``model_config_list``, base paths
        made absolute.

    Raises:
        ValueError: neither or both of the two ways, more names than base
            paths, a duplicated name, a config without ``model_config_list``
            or a text proto that does not parse (naming the file).
    """
    from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

    model_names = list(model_names or ())
    model_base_paths = [str(p) for p in (model_base_paths or ())]
    if model_config_file and (model_names or model_base_paths):
        raise ValueError("give either `model_config_file` or `model_name`/`model_base_path`, "
                         f"not both (model_config_file={str(model_config_file)!r}, "
                         f"model_base_path={model_base_paths})")
    config = ModelServerConfig()
    if model_config_file:
        path = pathlib.Path(model_config_file)
        _parse_text_proto(path, config, "model_config_file")
        if not config.HasField("model_config_list"):
            raise ValueError(f"`model_config_file` {str(path)!r} has no model_config_list")
        base_dir = path.resolve().parent
        for model in config.model_config_list.config:
            if not model.base_path:
                raise ValueError(f"`model_config_file` {str(path)!r}: model {model.name!r} "
                                 "has no base_path")
            if not pathlib.Path(model.base_path).is_absolute():
                model.base_path = str(base_dir / model.base_path)
    else:
        if not model_base_paths:
            raise ValueError("give `model_base_path` (with `model_name`) or `model_config_file`")
        if len(model_names) > len(model_base_paths):
            raise ValueError("each `model_name` needs a `model_base_path`, got "
                             f"model_name={model_names}, model_base_path={model_base_paths}")
        for base, name in itertools.zip_longest(model_base_paths, model_names):
            config.model_config_list.config.add(  # no name: the folder's, below
                base_path=str(pathlib.Path(base).resolve()), name=name,
                model_platform="tensorflow")
    for model in config.model_config_list.config:
        if not model.name:
            model.name = pathlib.Path(model.base_path).name
        if not model.name or "/" in model.name or ":" in model.name:
            # The REST paths /v1/models/<name>[:verb] cannot name it.
            raise ValueError(f"model name {model.name!r} (base path {model.base_path!r}) must "
                             "be non-empty, without '/' or ':', which the REST API's paths "
                             "cannot hold")
        if model.model_platform not in ("", "tensorflow"):
            raise ValueError(f"model {model.name!r}: model_platform={model.model_platform!r}; "
                             "this server serves 'tensorflow' SavedModels only")
    names = [m.name for m in config.model_config_list.config]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"model names must be unique, got {duplicated} more than once")
    return config


def batching_options(batching_parameters_file=None):
    """``BatchingOptions`` from a text ``BatchingParameters`` file.

    Args:
        batching_parameters_file: path, or None for TF Serving's defaults.

    Raises:
        ValueError: the file does not parse, sets a field this server does
            not implement (``pad_variable_length_inputs``,
            ``enable_large_batch_splitting``), or a value is out of range.
    """
    if batching_parameters_file is None:
        return BatchingOptions()
    path = pathlib.Path(batching_parameters_file)
    params = _message_class("BatchingParameters")()
    _parse_text_proto(path, params, "batching_parameters_file")
    if params.pad_variable_length_inputs or params.enable_large_batch_splitting.value:
        raise ValueError(f"`batching_parameters_file` {str(path)!r}: pad_variable_length_inputs "
                         "and enable_large_batch_splitting are not supported by this server")
    kwargs = {name: int(getattr(params, name).value) for name in (
        "max_batch_size", "batch_timeout_micros", "num_batch_threads",
        "max_enqueued_batches") if params.HasField(name)}
    try:
        return BatchingOptions(**kwargs, allowed_batch_sizes=tuple(params.allowed_batch_sizes))
    except ValueError as err:
        raise ValueError(f"`batching_parameters_file` {str(path)!r}: {err}") from err


def configure_tensorflow_threads(intra_op=0, inter_op=0, session=0):
    """Sets TensorFlow's thread pools as ``tensorflow_model_server``'s
    ``--tensorflow_{intra_op,inter_op,session}_parallelism`` do (0 =
    TensorFlow's own choice, one thread per core; ``session`` sets both pools
    where the other two are 0); call it before the process's first op.

    Many concurrent requests of small ops keep the cores busiest with
    ``intra_op=1`` (docs/measurements.md, ``bench/bench_serving.py`` at 32da1ca).

    Args:
        intra_op, inter_op, session: ints >= 0, threads.

    Returns:
        ``{"intra_op": int, "inter_op": int}`` as TensorFlow now reports them.

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
            raise ValueError(f"--tensorflow_{flag}_parallelism must be an int >= 0, got {value!r}")
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
