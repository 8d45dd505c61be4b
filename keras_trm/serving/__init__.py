"""Serving: a REST server that speaks TF Serving's REST API."""

from keras_trm.serving.rest import ModelRepository, create_app, predict

__all__ = ["ModelRepository", "create_app", "predict"]
