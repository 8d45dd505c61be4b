"""TF Serving's gRPC API over a ``ModelManager``, with the protos of the
``tensorflow-serving-api`` package, so its client stubs work unchanged:

- ``tensorflow.serving.PredictionService``: ``Predict`` (``inputs`` and
  ``outputs`` as ``TensorProto``; ``output_filter`` honoured) and
  ``GetModelMetadata`` (``metadata_field: "signature_def"``, answering a
  packed ``SignatureDefMap``). ``Classify``, ``Regress`` and
  ``MultiInference`` answer ``UNIMPLEMENTED``.
- ``tensorflow.serving.ModelService``: ``GetModelStatus``.

Errors carry TF Serving's status codes (``INVALID_ARGUMENT``, ``NOT_FOUND``,
``UNAVAILABLE``, ...); anything unexpected is ``INTERNAL`` naming the
exception.
"""

import logging
import time

import grpc
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
    predict_pb2, prediction_service_pb2_grpc)

from keras_trm.serving.errors import InvalidArgument, ServingError
from keras_trm.serving.rest import DEFAULT_MAX_REQUEST_ROWS, check_rows

log = logging.getLogger("keras_trm.serving")


def _spec_args(model_spec):
    which = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if which == "version" else None
    label = model_spec.version_label if which == "version_label" else None
    return model_spec.name, version, label


def _guard(method):
    """Turns errors into gRPC statuses (never an unhandled exception) and
    records each call in ``self.metrics`` where there is one."""
    def wrapper(self, request, context):
        start = time.perf_counter()
        try:
            response = method(self, request, context)
            status, message = grpc.StatusCode.OK, ""
        except ServingError as err:
            status, message = grpc.StatusCode[err.code], str(err)
        except Exception as err:  # noqa: BLE001 - answered, never raised
            log.exception("gRPC %s failed", method.__name__)
            status, message = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"
        if self.metrics is not None and request.model_spec.name:
            self.metrics.record(request.model_spec.name, method.__name__, "GRPC",
                                status.name, time.perf_counter() - start)
        if status is grpc.StatusCode.OK:
            return response
        context.abort(status, message)
    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _count_values(proto):
    """How many values a TensorProto carries (``tensor_content`` bytes / the
    item size, or the length of its typed repeated field); None when the
    dtype is not one of the request dtypes checked here."""
    import numpy as np
    from tensorflow.core.framework import types_pb2

    if proto.dtype == types_pb2.DT_STRING:
        return len(proto.string_val)
    fields = {types_pb2.DT_FLOAT: ("float_val", np.float32),
              types_pb2.DT_DOUBLE: ("double_val", np.float64),
              types_pb2.DT_INT32: ("int_val", np.int32),
              types_pb2.DT_INT64: ("int64_val", np.int64),
              types_pb2.DT_BOOL: ("bool_val", np.bool_)}
    if proto.dtype not in fields:
        return None
    field, dtype = fields[proto.dtype]
    if proto.tensor_content:
        return len(proto.tensor_content) // np.dtype(dtype).itemsize
    return len(getattr(proto, field))


def check_tensor_proto(key, proto, max_request_rows):
    """Refuses, before TensorFlow expands it, a TensorProto whose declared
    shape has more than ``max_request_rows`` rows, or more elements than its
    values where it has more than one value (TensorFlow repeats a single
    value, or the last one, to fill the shape: a 47-byte request can
    declare millions of elements). One value filling a shape (a splat)
    stays allowed up to ``max_request_rows`` elements.

    Raises:
        InvalidArgument: naming the input, the declared shape and the limit.
    """
    dims = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"input {key!r}: a negative dimension in shape {dims}")
    if dims:
        check_rows(key, dims[0], max_request_rows)
    elements = 1
    for d in dims:
        elements *= d
    given = _count_values(proto)
    if given is None or given == elements:
        return
    if given > 1 or elements > max_request_rows:
        raise InvalidArgument(
            f"input {key!r}: shape {dims} declares {elements} values but the "
            f"tensor carries {given} (only a single value may fill a shape, "
            f"and only up to {max_request_rows} values: max_request_rows)")


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``Predict`` and ``GetModelMetadata`` over a ``ModelManager``
    (``metrics``: an optional ``monitoring.Metrics`` recording each call;
    ``max_request_rows``: the most rows an input may declare)."""

    def __init__(self, manager, metrics=None,
                 max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
        self.manager = manager
        self.metrics = metrics
        self.max_request_rows = int(max_request_rows)

    @_guard
    def Predict(self, request, context):  # noqa: N802 - gRPC method name
        import tensorflow as tf

        name, version, label = _spec_args(request.model_spec)
        signature_name = request.model_spec.signature_name or "serving_default"
        with self.manager.acquire(name, version, label) as servable:
            servable.input_specs(signature_name)  # NOT_FOUND before parsing
            inputs = {}
            for key, proto in request.inputs.items():
                check_tensor_proto(key, proto, self.max_request_rows)
                try:
                    inputs[key] = tf.make_ndarray(proto)
                except Exception as err:  # noqa: BLE001 - a malformed TensorProto
                    # TensorFlow names a dtype it cannot read by number only
                    # ("bad TensorProto: 21" for DT_VARIANT).
                    dtype = types_pb2.DataType.Name(proto.dtype) if (
                        proto.dtype in types_pb2.DataType.values()) else proto.dtype
                    raise InvalidArgument(f"input {key!r}: bad TensorProto (dtype "
                                          f"{dtype}): {err}") from err
            if not context.is_active():
                # The client gave up (deadline, cancel) before the model ran.
                raise ServingError("the client cancelled the request or its "
                                   "deadline passed", code="CANCELLED")
            outputs = servable.predict(signature_name, inputs,
                                       tuple(request.output_filter))
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = signature_name
            for key, value in outputs.items():
                response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
            return response

    @_guard
    def GetModelMetadata(self, request, context):  # noqa: N802
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise InvalidArgument(
                f"metadata_field must be ['signature_def'], got {fields}")
        name, version, label = _spec_args(request.model_spec)
        with self.manager.acquire(name, version, label) as servable:
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, signature in servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(signature)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = servable.version
            response.metadata["signature_def"].Pack(signature_map)
            return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``GetModelStatus`` over a ``ModelManager`` (``metrics`` as above)."""

    def __init__(self, manager, metrics=None):
        self.manager = manager
        self.metrics = metrics

    @_guard
    def GetModelStatus(self, request, context):  # noqa: N802
        from tensorflow.core.protobuf import error_codes_pb2

        name, version, label = _spec_args(request.model_spec)
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, state, error in self.manager.status(name, version, label):
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            entry.status.error_code = (error_codes_pb2.UNKNOWN if error
                                       else error_codes_pb2.OK)
            entry.status.error_message = error
        return response


def add_services(server, manager, metrics=None,
                 max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
    """Registers both services of ``manager`` on a ``grpc.Server``; calls
    are recorded in ``metrics`` (a ``monitoring.Metrics``) where given."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(manager, metrics, max_request_rows), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelService(manager, metrics), server)
