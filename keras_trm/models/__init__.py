"""Functional models built from keras_trm layers."""

from keras_trm.models.classifiers import (
    ClassifierModel,
    check_images,
    encoder_classifier,
    lenet_cnn,
    lstm_classifier,
    text_classifier,
)
from keras_trm.models.functional import IntegerInputsModel
from keras_trm.models.transformer import (
    Transformer,
    as_transformer,
    transformer,
    transformer_base,
    transformer_big,
    transformer_small,
)
from keras_trm.models.transformer_xl import (
    TransformerXLLM,
    vanilla_transformer_lm,
)

__all__ = [
    "check_images",
    "ClassifierModel",
    "IntegerInputsModel",
    "Transformer",
    "TransformerXLLM",
    "encoder_classifier",
    "lenet_cnn",
    "lstm_classifier",
    "text_classifier",
    "as_transformer",
    "transformer",
    "transformer_base",
    "transformer_big",
    "transformer_small",
    "vanilla_transformer_lm",
]
