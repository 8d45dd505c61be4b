"""TF Serving's gRPC API over a ``ModelManager``, with the protos of the
``tensorflow-serving-api`` package, so its client stubs work unchanged:
``tensorflow.serving.PredictionService`` ``Predict`` (``output_filter``
honoured) and ``GetModelMetadata`` (``metadata_field: "signature_def"``; a
packed ``SignatureDefMap``), and ``ModelService.GetModelStatus``;
``Classify``, ``Regress`` and ``MultiInference`` answer ``UNIMPLEMENTED``.

Errors carry TF Serving's status codes (``INVALID_ARGUMENT``, ``NOT_FOUND``,
...); anything unexpected is ``INTERNAL`` naming the exception.
"""

import functools
import logging
import math
import time

import grpc
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import error_codes_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
    predict_pb2, prediction_service_pb2_grpc)

from keras_trm.serving.errors import InvalidArgument, ServingError
from keras_trm.serving.rest import DEFAULT_MAX_REQUEST_ROWS, check_rows

log = logging.getLogger("keras_trm.serving")
# The typed value field of each request dtype whose values are counted.
_VALUE_FIELDS = {types_pb2.DT_STRING: "string_val", types_pb2.DT_FLOAT: "float_val",
                 types_pb2.DT_DOUBLE: "double_val", types_pb2.DT_INT32: "int_val",
                 types_pb2.DT_INT64: "int64_val", types_pb2.DT_BOOL: "bool_val"}


def _spec_args(model_spec):
    which = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if which == "version" else None
    label = model_spec.version_label if which == "version_label" else None
    return model_spec.name, version, label


def _guard(method):
    """Turns errors into gRPC statuses (never an unhandled exception) and
    records each call in ``self.metrics`` where there is one."""
    @functools.wraps(method)
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
    return wrapper


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
    elements = math.prod(dims)
    field = _VALUE_FIELDS.get(proto.dtype)
    if field is None:
        return  # a dtype not checked here
    if proto.tensor_content and proto.dtype != types_pb2.DT_STRING:
        given = len(proto.tensor_content) // tf.dtypes.as_dtype(proto.dtype).size
    else:
        given = len(getattr(proto, field))
    if given != elements and (given > 1 or elements > max_request_rows):
        raise InvalidArgument(f"input {key!r}: shape {dims} declares {elements} values but the "
                              f"tensor carries {given} (only a single value may fill a shape, and "
                              f"only up to {max_request_rows} values: max_request_rows)")


class _Service:
    """A service over a ``ModelManager`` (``metrics``: an optional
    ``monitoring.Metrics`` recording each call; ``max_request_rows``: the
    most rows an input may declare)."""

    def __init__(self, manager, metrics=None, max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
        self.manager = manager
        self.metrics = metrics
        self.max_request_rows = int(max_request_rows)


class PredictionService(_Service, prediction_service_pb2_grpc.PredictionServiceServicer):
    """``Predict`` and ``GetModelMetadata``."""

    @_guard
    def Predict(self, request, context):  # noqa: N802 - gRPC method name
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
            if not context.is_active():  # the client gave up before the model ran
                raise ServingError("the client cancelled the request or its "
                                   "deadline passed", code="CANCELLED")
            outputs = servable.predict(signature_name, inputs, tuple(request.output_filter))
            return predict_pb2.PredictResponse(
                model_spec={"name": name, "version": {"value": servable.version},
                            "signature_name": signature_name},
                outputs={k: tf.make_tensor_proto(v) for k, v in outputs.items()})

    @_guard
    def GetModelMetadata(self, request, context):  # noqa: N802
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise InvalidArgument(f"metadata_field must be ['signature_def'], got {fields}")
        name, version, label = _spec_args(request.model_spec)
        with self.manager.acquire(name, version, label) as servable:
            response = get_model_metadata_pb2.GetModelMetadataResponse(
                model_spec={"name": name, "version": {"value": servable.version}})
            response.metadata["signature_def"].Pack(get_model_metadata_pb2.SignatureDefMap(
                signature_def=servable.signature_defs))
            return response


class ModelService(_Service, model_service_pb2_grpc.ModelServiceServicer):
    """``GetModelStatus``."""

    @_guard
    def GetModelStatus(self, request, context):  # noqa: N802
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, state, error in self.manager.status(*_spec_args(request.model_spec)):
            response.model_version_status.add(
                version=number, state=get_model_status_pb2.ModelVersionStatus.State.Value(state),
                status={"error_code": error_codes_pb2.UNKNOWN if error else error_codes_pb2.OK,
                        "error_message": error})
        return response


def add_services(server, manager, metrics=None,
                 max_request_rows=DEFAULT_MAX_REQUEST_ROWS):
    """Registers both services of ``manager`` on a ``grpc.Server``; calls
    are recorded in ``metrics`` (a ``monitoring.Metrics``) where given."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(manager, metrics, max_request_rows), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(
        ModelService(manager, metrics), server)
