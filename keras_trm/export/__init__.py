"""Export: SavedModel in TF Serving layout (raw-text signatures)."""

from keras_trm.export.saved_model import export_module, next_version

# Recipe export wrappers (IMDB, MNIST, Transformer-XL LM).
from keras_trm.export.classifiers import DigitClassifier, ReviewClassifier
from keras_trm.export.language_model import (
    TransformerXLServing,
    export_language_model,
)

__all__ = [
    "export_module",
    "next_version",
    # Recipe export wrappers.
    "DigitClassifier",
    "ReviewClassifier",
    "TransformerXLServing",
    "export_language_model",
]
