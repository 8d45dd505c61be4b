"""Functional models built from keras_trm layers."""

from keras_trm.models.transformer import (
    TransformerParts,
    transformer,
    transformer_base,
    transformer_big,
    transformer_small,
)

__all__ = [
    "TransformerParts",
    "transformer",
    "transformer_base",
    "transformer_big",
    "transformer_small",
]
