"""Serving errors with TF Serving's status codes, for REST and gRPC alike.

Each error carries the ``tensorflow.error.Code`` name TF Serving would
answer with; ``http_status`` maps it the way TF Serving's REST handler does
(INVALID_ARGUMENT -> 400, NOT_FOUND -> 404, UNAVAILABLE -> 503, ...).
"""

HTTP_STATUS = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 412,
    "ABORTED": 409, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "INTERNAL": 500,
    "UNAVAILABLE": 503, "DATA_LOSS": 500, "UNAUTHENTICATED": 401,
}


class ServingError(Exception):
    """A request the server answers with an error status: ``message`` says
    what went wrong, naming the argument and the value; ``code`` is TF
    Serving's status code name (``"INVALID_ARGUMENT"``, ...; default: the
    class's) and ``http_status`` the REST status for it."""

    code = "INTERNAL"

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code or self.code

    @property
    def http_status(self):
        return HTTP_STATUS.get(self.code, 500)


class InvalidArgument(ServingError):
    """A malformed request: 400 / ``INVALID_ARGUMENT``."""

    code = "INVALID_ARGUMENT"


class NotFound(ServingError):
    """Unknown model, version, label or signature: 404 / ``NOT_FOUND``."""

    code = "NOT_FOUND"


class Unavailable(ServingError):
    """Batch queue full or server shutting down: 503 / ``UNAVAILABLE``."""

    code = "UNAVAILABLE"


def from_tf_error(err):
    """The ``ServingError`` (``InvalidArgument`` for that code) with the
    status code of a ``tf.errors.OpError``."""
    from tensorflow.core.protobuf import error_codes_pb2

    code = {v: k for k, v in error_codes_pb2.Code.items()}.get(int(err.error_code), "UNKNOWN")
    cls = InvalidArgument if code == "INVALID_ARGUMENT" else ServingError
    return cls(f"{type(err).__name__}: {err.message}", code=code)


def check_input_names(expected, given, signature_name=None):
    """Raises ``InvalidArgument`` naming the missing and unknown inputs when
    the names ``given`` differ from the signature's ``expected`` ones."""
    missing = sorted(set(expected) - set(given))
    unknown = sorted(set(given) - set(expected))
    if missing or unknown:
        where = "the signature" if signature_name is None else f"signature {signature_name!r}"
        raise InvalidArgument(f"{where} takes inputs {sorted(expected)}; missing: {missing}, "
                              f"unknown: {unknown}")
