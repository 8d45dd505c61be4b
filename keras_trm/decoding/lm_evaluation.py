"""Language-model evaluation on ordered streams (Dai et al. 2019 §3.1-3.2).

* ``evaluate_with_memory``: Transformer-XL, segment by segment, each
  segment's new memories fed to the next (the memory-carrying evaluation).
* ``evaluate_sliding_window``: a fixed-context model, one new token per
  step over a window of ``context_len`` tokens (the vanilla procedure whose
  cost the memory removes).
* ``evaluate_disjoint_segments``: a memory-less model on consecutive
  disjoint segments (its training-time view of the data).

All return the mean negative log-likelihood per predicted token in nats
(``exp`` of it is the perplexity; divide by ln 2 for bits). Streams are
int ``(batch_size, n)`` arrays from
``keras_trm.data.language_modeling.batchify``.
"""

import itertools
import weakref

import keras
import numpy as np
from keras import ops

from keras_trm.data.language_modeling import segments
from keras_trm.utils import checks as v

# Compiled evaluation steps per model and key, so that repeated evaluations
# (the validation split during training) reuse the trace; mem_len is part of
# the key, a Python int baked into the trace.
_EVAL_STEPS = weakref.WeakKeyDictionary()


def _compiled(model, key, fn, static=True):
    """``fn(call, *arrays)`` compiled for inference, cached per ``(model,
    key)``; ``call(*args)`` runs ``model(*args, training=False)`` with the
    model's current weights: a ``tf.function`` (a generalized trace unless
    ``static``), a ``jax.jit``, or PyTorch eagerly without autograd."""
    steps = _EVAL_STEPS.setdefault(model, {})
    if key in steps:
        return steps[key]
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        step = tf.function(
            lambda *arrays: fn(lambda *args: model(*args, training=False), *arrays),
            reduce_retracing=not static)
    elif backend == "jax":
        import jax

        def pure(trainable, non_trainable, *arrays):
            return fn(lambda *args: model.stateless_call(
                trainable, non_trainable, *args, training=False)[0], *arrays)

        jitted = jax.jit(pure)
        step = lambda *arrays: jitted(  # noqa: E731
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables], *arrays)
    else:
        import torch

        def step(*arrays):
            with torch.no_grad():
                return fn(lambda *args: model(*args, training=False), *arrays)
    steps[key] = step
    return step


def _vocabulary_size(model):
    """The ids a language model embeds: ``model.vocabulary_size``
    (``TransformerXLLM``), its ``"embedding"`` layer's
    (``vanilla_transformer_lm``), else the width of its output; None when
    none is known (then ids are not range-checked)."""
    size = getattr(model, "vocabulary_size", None)
    if size is None:
        try:
            size = model.get_layer("embedding").vocabulary_size
        except (ValueError, AttributeError):
            try:
                size = model.output_shape[-1]
            except (AttributeError, ValueError, TypeError, IndexError):
                size = None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _check_streams(model, streams):
    """``streams`` as a 2-D integer NumPy array of at least one stream, its
    ids in the model's vocabulary, checked on the host once per evaluation
    (in the graph, an id past the vocabulary failed in the embedding
    lookup, or read a row of NaN under JAX).

    Raises:
        ValueError: not 2-D, no stream, ids outside the vocabulary.
        TypeError: not integer ids.
    """
    streams = np.asarray(streams)
    if streams.ndim != 2:
        raise ValueError(
            "`streams` must be 2-D (batch_size, n) as made by batchify, got "
            f"streams.shape={streams.shape}")
    v.integer_ids("streams", streams)
    if streams.shape[0] == 0:
        raise ValueError(
            f"`streams` of shape {streams.shape} hold no stream, so no "
            "(input, target) pair: nothing to average over")
    size = _vocabulary_size(model)
    if size is not None:
        v.host_ids_in_range("streams", streams, size, "the model's vocabulary")
    return streams


def _summed_nll(targets, logits):
    # In float32, as lm_loss: a bfloat16 sum loses about 0.4% per segment.
    return ops.sum(ops.sparse_categorical_crossentropy(
        targets, ops.cast(logits, "float32"), from_logits=True))


def _all_positions(call, inputs, targets):
    return _summed_nll(targets, call(inputs))


def _mean_nll(streams, seg_len, score, max_segments=None):
    """Mean of ``score(inputs, targets)`` (summed NLL) per target over the
    first ``max_segments`` (default all) of ``segments(streams, seg_len)``."""
    total, count = 0.0, 0
    for inputs, targets in itertools.islice(segments(streams, seg_len), max_segments):
        total += float(score(inputs, targets))
        count += targets.size
    if count == 0:
        raise ValueError(
            f"`streams` of shape {streams.shape} hold no (input, target) pair")
    return total / count


# Memories grow by seg_len per segment up to mem_len: up to this many
# segments to fill them, each shape gets its own static trace (which lets
# RelativeMultiHeadAttention use its banded path); beyond, one generalized
# trace serves all.
_MAX_STATIC_FILL = 4


def _memory_eval_step(model, seg_len):
    static = -(-model.mem_len // seg_len) <= _MAX_STATIC_FILL

    def forward(call, inputs, targets, memories):
        logits, new_memories = call(inputs, memories)
        return _summed_nll(targets, logits), new_memories

    return _compiled(model, ("memory", model.mem_len, static), forward, static)


def evaluate_with_memory(model, streams, seg_len, max_segments=None):
    """Mean NLL per token (nats) of ordered streams, carrying memories.

    Walks ``segments(streams, seg_len)`` in order (the last, possibly
    shorter, segment included) and feeds each segment's ``new_memories`` to
    the next, so a token sees up to ``model.mem_len`` positions of earlier
    segments besides its own segment (Dai et al. 2019 §3.2, evaluation).
    Dropout is off.

    Args:
        model: a ``TransformerXLLM``.
        streams: int ``(batch_size, n)`` from ``batchify``.
        seg_len: int, 0 < seg_len <= ``model.max_segment_len``.
        max_segments: optional int >= 1, stop after this many segments.

    Returns:
        float, the mean negative log-likelihood over all predicted tokens.

    Raises:
        ValueError: ``seg_len`` larger than ``model.max_segment_len``,
            ``max_segments`` < 1, ``streams`` not 2-D, with no stream or no
            (input, target) pair, or ids outside the model's vocabulary.
        TypeError: ``seg_len`` or ``max_segments`` not an int, ``streams``
            not integer ids.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import TransformerXLLM
    >>> model = TransformerXLLM(7, num_layers=1, d_model=8, num_heads=2,
    ...                         d_ff=16, mem_len=4, max_segment_len=4)
    >>> nll = evaluate_with_memory(model, np.ones((2, 9), "int32"), 4)
    >>> 0.0 < nll < 10.0
    True
    """
    seg_len = v.positive_int("seg_len", seg_len)
    if seg_len > model.max_segment_len:
        raise ValueError(
            f"`seg_len`={seg_len} is longer than max_segment_len="
            f"{model.max_segment_len} of model '{model.name}'")
    if max_segments is not None:  # not blaming the data for 0
        max_segments = v.positive_int("max_segments", max_segments)
    streams = _check_streams(model, streams)
    forward = _memory_eval_step(model, seg_len)
    memories = model.init_memories(streams.shape[0])

    def score(inputs, targets):
        nonlocal memories
        nll, memories = forward(inputs, targets, memories)
        return nll

    return _mean_nll(streams, seg_len, score, max_segments)


def evaluate_disjoint_segments(model, streams, seg_len):
    """Mean NLL per token (nats) of a memory-less model on consecutive
    disjoint segments of ``seg_len`` (each segment starts without context),
    the vanilla model's training-time view of the data.

    Args:
        model: maps int ``(batch, T)`` ids to logits ``(batch, T, V)``.
        streams: int ``(batch_size, n)`` from ``batchify``.
        seg_len: int > 0.

    Raises:
        ValueError: ``streams`` not 2-D, with no stream or no (input,
            target) pair, or ids outside the model's vocabulary.
        TypeError: ``seg_len`` not an int, ``streams`` not integer ids.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import vanilla_transformer_lm
    >>> model = vanilla_transformer_lm(7, num_layers=1, d_model=8,
    ...                                num_heads=2, d_ff=16,
    ...                                max_sequence_length=4)
    >>> 0.0 < evaluate_disjoint_segments(model, np.ones((2, 9), "int32"), 4)
    True
    """
    seg_len = v.positive_int("seg_len", seg_len)
    streams = _check_streams(model, streams)
    return _mean_nll(streams, seg_len,
                     _compiled(model, "all_positions", _all_positions, static=False))


def evaluate_sliding_window(vanilla_model, streams, context_len,
                            max_tokens=None):
    """Mean NLL per token of a fixed-context model, one token per step.

    The vanilla Transformer evaluation of Dai et al. (2019) §3.1 / Al-Rfou
    et al. (2018): token t + 1 is predicted from the last position of the
    model run on tokens ``[t - context_len + 1, t]``, so every step
    recomputes the whole context. The first ``context_len`` predictions
    come from one causal pass (what shorter windows would give).

    Args:
        vanilla_model: a model mapping int ``(batch, T)`` ids to logits
            ``(batch, T, V)``, e.g. ``vanilla_transformer_lm(...)``.
        streams: int ``(batch_size, n)`` from ``batchify``.
        context_len: int > 0, the window length (at most the model's
            ``max_sequence_length``).
        max_tokens: optional int > 0, score only the first ``max_tokens``
            predictions of *each* stream (targets at positions
            ``1..max_tokens``); default all ``n - 1``.

    Returns:
        float, mean NLL (nats) over ``batch_size * min(n - 1, max_tokens)``
        predictions.

    Raises:
        ValueError: ``context_len`` above the model's
            ``max_sequence_length``, ``max_tokens`` < 1, ``streams`` not
            (batch_size, n) with n >= 2, with no stream (nothing to
            average), or ids outside the model's vocabulary.
        TypeError: ``context_len`` or ``max_tokens`` not an int,
            ``streams`` not integer ids.

    Example (on streams no longer than the window, the sliding window and
    disjoint segments see the same context):

    >>> import numpy as np
    >>> from keras_trm.models import vanilla_transformer_lm
    >>> lm = vanilla_transformer_lm(7, 1, 8, 2, 16, max_sequence_length=4)
    >>> streams = np.arange(10, dtype="int32").reshape(2, 5) % 7
    >>> sliding = evaluate_sliding_window(lm, streams, context_len=4)
    >>> abs(sliding - evaluate_disjoint_segments(lm, streams, 4)) < 1e-5
    True
    """
    context_len = v.positive_int("context_len", context_len)
    try:
        positions = vanilla_model.get_layer("embedding").max_sequence_length
    except (ValueError, AttributeError):
        positions = None
    if positions is not None and context_len > positions:
        raise ValueError(
            f"`context_len`={context_len} is longer than max_sequence_length="
            f"{positions} of model '{vanilla_model.name}'")
    streams = _check_streams(vanilla_model, streams)
    if streams.shape[1] < 2:
        raise ValueError("`streams` must be (batch_size, n) with n >= 2, got "
                         f"streams.shape={streams.shape}")
    limit = streams.shape[1] - 1
    if max_tokens is not None:
        limit = min(limit, v.positive_int("max_tokens", max_tokens))
    streams = streams.astype(np.int32)

    all_positions = _compiled(vanilla_model, "all_positions", _all_positions, static=False)
    last_position = _compiled(
        vanilla_model, "last_position", lambda call, window, target:
        _summed_nll(target, call(window)[:, -1]))

    first = min(context_len, limit)
    total = float(all_positions(streams[:, :first], streams[:, 1:first + 1]))
    for t in range(context_len, limit):
        total += float(last_position(streams[:, t - context_len + 1:t + 1], streams[:, t + 1]))
    return total / (streams.shape[0] * limit)
