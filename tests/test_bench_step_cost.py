"""bench/bench_step_cost.py's helpers: the token limit it divides by is the
one the search runs to, and its matmul floor multiplies exactly the
kernels a decoding step uses."""

import pathlib
import sys

import numpy as np
import tensorflow as tf

from keras_trm.decoding import beam_search
from keras_trm.models import transformer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from bench_step_cost import matmul_floor, step_limit  # noqa: E402


def _model():
    return transformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=40,
                       max_sequence_length=64, dropout_rate=0.0)


def test_never_stopping_runs_to_the_step_limit():
    model = _model()
    tokens = np.array([[5, 6, 7, 3]], np.int32)  # three words and END
    assert step_limit(model, tokens) == 4 + 50
    ids = beam_search(model, tf.constant(tokens), beam_size=4,
                      early_stopping="never")
    assert ids.shape[1] == step_limit(model, tokens)
    long = np.array([[5] * 20 + [3]], np.int32)
    assert step_limit(model, long) == 63  # capped at max_sequence_length - 1
    assert beam_search(model, tf.constant(long), beam_size=2,
                       early_stopping="never").shape[1] == 63


def test_matmul_floor_multiplies_the_kernels_of_one_step():
    model = _model()
    seconds, macs = matmul_floor(model, steps=3, rows=4)
    d, d_ff, vocab = 16, 40, 30
    # Per layer: self-attention q, k, v, W^O; cross-attention q, W^O (its
    # keys and values are computed once per sentence); the FFN; then the
    # output projection.
    assert macs == 2 * (6 * d * d + 2 * d * d_ff) + d * vocab
    assert set(seconds) == {"xla", "graph"} and all(s > 0 for s in seconds.values())
