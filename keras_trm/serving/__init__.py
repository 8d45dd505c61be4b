"""Serving: TF Serving's REST and gRPC APIs over export folders.

``ModelManager`` (models, versions, polling, batching) is what the
``ModelServer`` (waitress for REST, grpcio for gRPC) answers from;
``keras-trm serve`` starts one with ``tensorflow_model_server``'s flags.
"""

from keras_trm._optional import require_extra, require_tensorflow

require_tensorflow("keras_trm.serving")  # TensorFlow by design
require_extra("serve", ("flask", "waitress", "grpc", "tensorflow_serving"), "keras_trm.serving")

from keras_trm.serving.batching import BatchingOptions, BatchScheduler
from keras_trm.serving.config import (
    batching_options, configure_tensorflow_threads, model_server_config)
from keras_trm.serving.errors import InvalidArgument, NotFound, ServingError, Unavailable
from keras_trm.serving.manager import ModelManager, ServableVersion
from keras_trm.serving.monitoring import Metrics, monitoring_path
from keras_trm.serving.rest import create_app
from keras_trm.serving.server import ModelServer

__all__ = [
    "BatchScheduler", "BatchingOptions", "InvalidArgument", "Metrics", "ModelManager",
    "ModelServer", "NotFound", "ServableVersion", "ServingError", "Unavailable",
    "batching_options", "configure_tensorflow_threads", "create_app", "model_server_config",
    "monitoring_path",
]
