"""Greedy/beam search strategies over a key/value cache and the raw-text
``Translator`` / ``GreedyBleu`` (every Keras backend; ``Translator.translate``,
the graph a SavedModel serves, TensorFlow), language-model evaluation
(TensorFlow), BLEU."""

from keras_trm._optional import lazy_module_attributes
from keras_trm.decoding.search import (BeamSearch, DecodingModel,
                                      GreedySearch, SearchStrategy,
                                      encode_by_length, length_penalty,
                                      search_strategy)

__all__ = [
    "BeamSearch",
    "DecodingModel",
    "GreedyBleu",
    "GreedySearch",
    "SearchStrategy",
    "Translator",
    "corpus_bleu",
    "encode_by_length",
    "length_penalty",
    "search_strategy",
    # Language-model evaluation.
    "evaluate_disjoint_segments",
    "evaluate_sliding_window",
    "evaluate_with_memory",
]

# Imported on first use: the translator (TensorFlow under the TensorFlow
# backend), the language-model evaluation (tf.function segment loops:
# TensorFlow by design) and sacreBLEU.
__getattr__ = lazy_module_attributes(__name__, {
    "Translator": "keras_trm.decoding.translator",
    "GreedyBleu": "keras_trm.decoding.translator",
    "corpus_bleu": "keras_trm.decoding.bleu",
    "evaluate_disjoint_segments": "keras_trm.decoding.lm_evaluation",
    "evaluate_sliding_window": "keras_trm.decoding.lm_evaluation",
    "evaluate_with_memory": "keras_trm.decoding.lm_evaluation",
})
