"""Greedy/beam search over a key/value cache, and BLEU."""

from keras_trm.decoding.bleu import corpus_bleu
from keras_trm.decoding.search import (beam_search, encode_by_length,
                                      greedy_search, length_penalty)
from keras_trm.decoding.translator import Translator

# Language-model evaluation (memory-carrying, sliding window, disjoint).
from keras_trm.decoding.lm_evaluation import (
    evaluate_disjoint_segments,
    evaluate_sliding_window,
    evaluate_with_memory,
)

__all__ = [
    "Translator",
    "beam_search",
    "corpus_bleu",
    "encode_by_length",
    "greedy_search",
    "length_penalty",
    # Language-model evaluation.
    "evaluate_disjoint_segments",
    "evaluate_sliding_window",
    "evaluate_with_memory",
]
