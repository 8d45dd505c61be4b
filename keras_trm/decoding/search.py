"""Greedy and beam search over a key/value cache, on every Keras backend,
as strategy objects: ``GreedySearch()`` and ``BeamSearch(beam_size,
length_penalty, early_stopping)`` hold a search's settings and are called
on a model and its source ids (``search(model, encoder_tokens)``).

One algorithm, written in ``keras.ops``: the encoder runs once, its
keys/values are projected once per decoder layer
(``cross_attention_caches``), and each step feeds one token per hypothesis
through ``decode_step``, which writes its keys/values at the step's
position of fixed-size head-major caches ``(batch, h, steps, d_k)``. The
shapes never change inside the loop (``keras.ops.while_loop``), so JAX
(``jax.jit``), PyTorch and TensorFlow (``tf.function``, XLA) all run it;
sentences that have stopped are frozen while the others go on.

On TensorFlow without ``static_cache`` the strategy's same per-step
``update`` runs in ``keras_trm.decoding.graph_search``'s ``tf.while_loop``,
where the caches grow by one position per step (``decode_step(...,
grow=True)``) and the rows of finished sentences leave the batch, so a
batch costs what its sentences need. The ids are the same either way
(tested). ``use_cache=False`` re-runs the decoder over the whole prefix at
every step instead (the baseline the tests compare against).

Beam search ranks hypotheses by log P(Y|X) / lp(Y) with the length penalty
of Wu et al. (2016), Eq. 14: lp(Y) = ((5 + |Y|) / 6)^α, |Y| the number of
generated tokens (END included); Vaswani et al. (2017) §6.1 use beam size 4
and α = 0.6. The beam stays full (tensor2tensor's ``beam_search.py``,
fairseq's ``SequenceGenerator``): every step takes the 2k best extensions
of the k live hypotheses, moves those that end with END (and rank among
the first k, as in fairseq) into a per-sentence set of the k best
finished ones, and goes on with the k best that have not ended. Each
sentence's token limit is its own source length (END included, padding
not) + 50 (§6.1), capped by the model's positions (or the
``max_decoding_length`` given), so it decodes alike alone or in any batch;
a hypothesis that reaches it without END is finished with |Y| = the limit
(fairseq). A sentence stops when no live hypothesis can still beat its
best finished one: log P only decreases and lp only grows, so a live one
can at best reach log P / lp(limit) (tensor2tensor's bound): exact.
``early_stopping="first_end"`` adds CTranslate2's early exit, at the
first step whose best candidate (by log P) ends: the same for α = 0, for
α > 0 fewer steps and possibly other outputs
(``bench/results/decoding_val.json``). A beam of 1 gives greedy search's
ids.

The model: anything with the methods of ``DecodingModel``.

The special ids are the call's arguments (``start_id``, ``end_id``,
``pad_id``): the callers (``Translator``, the LiteRT and SavedModel exports)
pass their tokenizer's; the defaults are ``keras_trm.text``'s reserved ids (PAD 0,
START 2, END 3), read here only as those defaults.
"""

import dataclasses
import functools
import weakref
from typing import Optional, Protocol, Union

import keras
from keras import ops

from keras_trm.utils import checks as v
# Only the defaults of the ``start_id``, ``end_id``, ``pad_id`` arguments.
from keras_trm.utils.ids import END_ID, PAD_ID, START_ID

NEG_INF = -1e9


class DecodingModel(Protocol):
    """What the searches call on a model (``keras_trm.models.Transformer``,
    or ``keras_trm.export.litert``'s wrapper): encoding, then one cached
    step per position. Shapes: ``h`` heads of ``d_k`` channels, ``S``
    cached positions. ``use_cache=False`` calls the model's ``decode``
    instead (``Transformer.decode``: the whole prefix, no cache).

    Attributes:
        max_sequence_length: int, positions of the model (START included);
            a model with only the old ``max_length`` still works
            (deprecated).
        target_vocabulary_size: int, V.

    Example:

    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=8,
    ...                     max_sequence_length=8)
    >>> all(callable(getattr(model, name)) for name in (
    ...     "encode", "cross_attention_caches", "empty_caches", "decode_step"))
    True
    """

    max_sequence_length: int
    target_vocabulary_size: int

    def encode(self, encoder_tokens):
        """int ``(batch, T_src)`` -> float ``(batch, T_src, d_model)``."""

    def cross_attention_caches(self, encoder_outputs):
        """``(caches, shared)``, once per search: per decoder layer
        ``(keys, values)``, each ``(batch, h, T_src, d_k)`` (the searches
        may drop rows), and what every step shares (opaque to the
        searches: a tied model's transposed output kernel, or None)."""

    def empty_caches(self, batch_size, num_positions, dtype):
        """Per decoder layer ``(keys, values)`` of zeros, ``(batch, h,
        num_positions, d_k)`` (0 positions for caches that grow)."""

    def decode_step(self, tokens, index, caches, cross, encoder_padding_mask,
                    grow=False):
        """int ``(rows, 1)`` at position ``index`` -> ``(logits (rows, V)
        float32, caches)``: fixed-size caches written at ``index``, or
        with ``grow`` (graph search only) one position longer. ``cross``
        (``cross_attention_caches``) and the mask have one row per row of
        ``tokens`` or one per sentence of k consecutive rows."""


def length_penalty(length, alpha):
    """Wu et al. (2016) Eq. 14: ((5 + length) / 6) ** alpha (float32).

    Example:

    >>> float(length_penalty(1, 0.6))   # ((5 + 1) / 6) ** 0.6
    1.0
    >>> round(float(length_penalty(7, 1.0)), 4)
    2.0
    """
    length = ops.cast(length, "float32")
    return ops.power((5.0 + length) / 6.0, ops.cast(alpha, "float32"))


def _check_tokens(encoder_tokens, model):
    """The searches' source ids as an int32 tensor, checked: integer ids of
    shape (batch, T_src), and, where they are host values (NumPy, lists:
    nothing to copy back from a device), within the source vocabulary:
    under JAX an id past the embedding table reads a row of NaN, and every
    hypothesis of that sentence would be decoded from it."""
    size = getattr(getattr(model, "source_embedding", None), "vocabulary_size", None)
    if size is not None:
        v.host_ids_in_range("encoder_tokens", encoder_tokens, size,
                            "the model's source vocabulary")
    encoder_tokens = ops.convert_to_tensor(encoder_tokens)
    v.integer_ids("encoder_tokens", encoder_tokens)
    if len(encoder_tokens.shape) != 2:
        raise ValueError(
            "`encoder_tokens` must have shape (batch, T_src), got "
            f"{tuple(encoder_tokens.shape)}"
        )
    if encoder_tokens.shape[1] == 0 and encoder_tokens.shape[0] != 0:
        # No position, not even END: nothing for the decoder to attend to
        # (the backends failed each their own way on the empty maximum).
        # A batch of no sentence, (0, 0) included, is empty, not refused.
        raise ValueError(
            "`encoder_tokens` must have at least one position per sentence "
            "(the source ids and END), got a zero-width source of shape "
            f"{tuple(encoder_tokens.shape)}"
        )
    return ops.cast(encoder_tokens, "int32")


def _check_encoder_outputs(model, encoder_outputs, encoder_tokens):
    """``encoder_outputs`` given to a search, checked on its static shape
    and dtype only (nothing copied back from a device): float ``(batch,
    T_src, d_model)``, batch and T_src those of ``encoder_tokens`` and
    d_model the model's, where both are known. The backends otherwise
    failed deep inside the decoder with messages of their own."""
    if encoder_outputs is None:
        return None
    encoder_outputs = ops.convert_to_tensor(encoder_outputs)
    dtype = keras.backend.standardize_dtype(encoder_outputs.dtype)
    if "float" not in dtype:
        raise TypeError(
            "`encoder_outputs` must be float (the model's encoder output), "
            f"got dtype {dtype} (shape {tuple(encoder_outputs.shape)})")
    shape = tuple(encoder_outputs.shape)
    d_model = getattr(model, "d_model", None)
    expected = (encoder_tokens.shape[0], encoder_tokens.shape[1],
                d_model if isinstance(d_model, int) else None)
    if len(shape) != 3 or any(
            isinstance(got, int) and isinstance(want, int) and got != want
            for got, want in zip(shape, expected)):
        want = tuple("?" if n is None else n for n in expected)
        raise ValueError(
            "`encoder_outputs` must have shape (batch, T_src, d_model) = "
            f"{want} (`encoder_tokens` of shape "
            f"{tuple(encoder_tokens.shape)}, d_model={d_model}), got "
            f"encoder_outputs of shape {shape}")
    return encoder_outputs


def _is_tensorflow():
    return keras.backend.backend() == "tensorflow"


def batch_gather(x, indices):
    """``x[b, indices[b, j], ...]``: float or int ``(batch, n, ...)`` and int
    ``(batch, m)`` -> ``(batch, m, ...)`` (TensorFlow's ``tf.gather(x,
    indices, batch_dims=1)``).

    On TensorFlow it is that op (the graph the decoding benchmarks
    measured; ``ops.take_along_axis`` adds broadcasts and int64 casts
    there); elsewhere ``ops.take_along_axis``.

    Example:

    >>> import numpy as np
    >>> x = np.array([[10, 11, 12], [20, 21, 22]])
    >>> np.asarray(batch_gather(x, np.array([[2, 0], [1, 1]]))).tolist()
    [[12, 10], [21, 21]]
    """
    if _is_tensorflow():
        import tensorflow as tf

        return tf.gather(x, indices, batch_dims=1)
    x = ops.convert_to_tensor(x)
    indices = ops.cast(indices, "int32")
    trailing = tuple(x.shape[2:])
    if trailing:
        indices = ops.reshape(indices, tuple(indices.shape) + (1,) * len(trailing))
        indices = ops.broadcast_to(indices, tuple(indices.shape[:2]) + trailing)
    return ops.take_along_axis(x, indices, axis=1)


def encode_by_length(model, encoder_tokens, groups=4, pad_id=PAD_ID):
    """``model.encode(encoder_tokens)`` with less padding (TensorFlow
    graphs; on other backends ``model.encode``).

    The sentences, sorted by length, are encoded in ``groups`` groups,
    each padded only to its own longest sentence, and put back in order:
    the encoder's work follows the lengths rather than batch x the
    longest. Padding positions (never attended) hold the group's encoding
    or zeros. Real positions match ``model.encode`` up to float rounding;
    the searches' ids were identical for 1,000 of 1,000 Multi30k val and
    test sentences (``bench/results/encode_by_length.json``). Shapes vary
    with the lengths, which JAX and XLA would compile once each, so other
    backends encode the batch whole.

    Args:
        model: a ``keras_trm.models.Transformer``.
        encoder_tokens: int ``(batch, T_src)`` source ids.
        groups: int >= 1, the groups (1: ``model.encode`` as it is).
        pad_id: the tokenizer's padding id (default 0, ``keras_trm.text``'s
            ``PAD_ID``): what a sentence's length does not count.

    Returns:
        float ``(batch, T_src, d_model)``, as ``model.encode``.

    Raises:
        TypeError: non-integer ids, ``groups`` not an int. ValueError: bad
            shapes, ``groups`` < 1, host (NumPy) ids outside the source
            vocabulary.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    ...                     max_sequence_length=12)
    >>> source = np.array([[5, 6, 7, 8, 3], [7, 3, 0, 0, 0]], "int32")
    >>> grouped = encode_by_length(model, source, groups=2)
    >>> tuple(grouped.shape)
    (2, 5, 16)
    >>> bool(np.allclose(grouped[1, :2], model.encode(source)[1, :2], atol=1e-5))
    True
    """
    encoder_tokens = _check_tokens(encoder_tokens, model)
    groups = v.positive_int("groups", groups)
    if groups == 1 or not _is_tensorflow():
        return model.encode(encoder_tokens)
    from keras_trm.decoding.graph_search import encode_in_groups

    return encode_in_groups(model, encoder_tokens, groups, pad_id)


def model_positions(model):
    """The positions of a ``DecodingModel`` (START included):
    ``model.max_sequence_length``, or, for a model written before the
    rename, its ``max_length`` (with a ``DeprecationWarning``)."""
    if hasattr(model, "max_sequence_length"):
        return int(model.max_sequence_length)
    import warnings

    warnings.warn("a decoding model's `max_length` is now "
                  "`max_sequence_length`; the old name will go",
                  DeprecationWarning, stacklevel=v.caller_stacklevel())
    return int(model.max_length)


def check_decoding_length(model, max_decoding_length):
    """``max_decoding_length`` as an int in [1, the model's positions - 1],
    or None (the default limit); ValueError/TypeError naming it otherwise."""
    if max_decoding_length is None:
        return None
    positions = model_positions(model)
    value = v.positive_int("max_decoding_length", max_decoding_length)
    if value >= positions:
        raise ValueError(
            f"`max_decoding_length` must be in [1, {positions - 1}] for this "
            f"model ({positions} positions incl. START: max_sequence_length="
            f"{positions}), got max_decoding_length={max_decoding_length}"
        )
    return value


def decode_length(model, encoder_tokens, max_decoding_length, pad_id=PAD_ID):
    """``(steps, limits)``: the output width and each sentence's token limit
    (int32 ``(batch,)``). By default a sentence of n source tokens (END
    included, ``pad_id`` not) gets min(n + 50 (§6.1), the model's
    max_sequence_length - 1) and ``steps`` is that of the padded width (a
    Python int when the width is known); an int ``max_decoding_length``
    (checked by ``check_decoding_length``) is every sentence's limit."""
    if max_decoding_length is None:
        cap = model_positions(model) - 1
        own = ops.sum(ops.cast(ops.not_equal(encoder_tokens, pad_id), "int32"),
                      axis=1)
        width = ops.shape(encoder_tokens)[1]
        steps = (min(width + 50, cap) if isinstance(width, int)
                 else ops.minimum(width + 50, cap))
        return steps, ops.minimum(own + 50, cap)
    batch = ops.shape(encoder_tokens)[0]
    return max_decoding_length, ops.full((batch,), max_decoding_length, "int32")


def top_k(values, k):
    """The ``k`` largest entries of each row, best first, ties to the lower
    index, on every backend: ``(values (..., k), indices int32 (..., k))``.

    ``ops.top_k`` on TensorFlow and JAX, which order ties so; PyTorch's
    ``topk`` promises no order among equal values (on the CPU it returned
    index 3 before 1 for two equal maxima), so there a stable descending
    sort picks them (``ops.argsort`` of ``-values`` is stable on PyTorch).

    Example:

    >>> import numpy as np
    >>> v, i = top_k(np.array([[1., 3., 0., 3.]], "float32"), 2)
    >>> np.asarray(v).tolist(), np.asarray(i).tolist()
    ([[3.0, 3.0]], [[1, 3]])
    """
    values = ops.convert_to_tensor(values)
    if keras.backend.backend() == "torch":
        order = ops.argsort(-values, axis=-1)[..., :k]
        return ops.take_along_axis(values, order, axis=-1), ops.cast(order,
                                                                    "int32")
    top_values, indices = ops.top_k(values, k)
    return top_values, ops.cast(indices, "int32")


# -- helpers of the beam's update and the fixed-size loop ------------------

def _stable_order(rank, score):
    """Indices ``(batch, n)`` ordering ``rank`` (bool) first, then
    ``score``, both descending, ties in index order: for each entry, the
    number of entries that come before it is its place (exact and stable
    on every backend; n = 2k is small)."""
    rank = ops.cast(rank, "int32")
    n = score.shape[1]
    index = ops.arange(n, dtype="int32")
    r_i, r_j = ops.expand_dims(rank, 2), ops.expand_dims(rank, 1)
    s_i, s_j = ops.expand_dims(score, 2), ops.expand_dims(score, 1)
    before = (r_j > r_i) | ((r_j == r_i) & (
        (s_j > s_i) | ((s_j == s_i) & (index[None, None, :] < index[None, :, None]))))
    place = ops.sum(ops.cast(before, "int32"), axis=2)  # (batch, n)
    # order[p] = the entry whose place is p.
    at = ops.equal(ops.expand_dims(place, 1), index[None, :, None])
    return ops.cast(ops.argmax(ops.cast(at, "int32"), axis=2), "int32")


# -- the fixed-size loop (every backend) -----------------------------------

class Stepper:
    """The decoder one position at a time for both loops: over the model's
    caches, fixed-size (``width`` positions) or growing (``width=None``,
    graph search), or, with ``use_cache=False``, over the whole prefix.

    ``context`` is what the decoder reads of the source: with a cache the
    cross-attention caches and the padding mask, one row per sentence (the
    step groups each sentence's ``hypotheses`` rows), and the model's
    ``shared`` part apart (graph search drops rows of ``context`` only);
    without, the encoder outputs and mask repeated per hypothesis.
    """

    def __init__(self, model, encoder_outputs, encoder_mask, use_cache,
                 hypotheses=1, width=None):
        self.model, self.use_cache, self.grow = model, use_cache, width is None
        self.shared = None
        rows = ops.shape(encoder_outputs)[0] * hypotheses
        if use_cache:
            caches, self.shared = model.cross_attention_caches(encoder_outputs)
            self.context = (caches, encoder_mask)
            self.initial_state = model.empty_caches(
                rows, 0 if self.grow else width, encoder_outputs.dtype)
            return
        if hypotheses > 1:
            encoder_outputs = ops.repeat(encoder_outputs, hypotheses, 0)
            encoder_mask = ops.repeat(encoder_mask, hypotheses, 0)
        self.context = (encoder_outputs, encoder_mask)
        self.initial_state = []

    def __call__(self, sequences, index, state, context=None):
        """sequences: int ``(N, width)``; returns ``(logits (N, V), state)``
        at position ``index``."""
        source, encoder_mask = context or self.context
        rows = ops.shape(sequences)[0]
        if self.use_cache:
            tokens = ops.slice(sequences, (0, index), (rows, 1))
            return self.model.decode_step(tokens, index, state,
                                          (source, self.shared), encoder_mask,
                                          grow=self.grow)
        if self.grow:
            logits = self.model.decode(sequences[:, :index + 1], source,
                                       encoder_mask)
            return logits[:, -1, :], state
        # The whole width: positions past ``index`` are PAD (masked keys)
        # and come after it (causal), so they change nothing at ``index``.
        logits = self.model.decode(sequences, source, encoder_mask)
        vocab = ops.shape(logits)[2]
        return ops.slice(logits, (0, index, 0), (rows, 1, vocab))[:, 0], state


def _reorder(structure, rows):
    return keras.tree.map_structure(lambda c: ops.take(c, rows, axis=0),
                                    structure)


# model -> {static arguments: jitted search}
_COMPILED = weakref.WeakKeyDictionary()


def _run(model, key, run, encoder_tokens, encoder_outputs):
    """``run(encoder_tokens, encoder_outputs)``; on JAX compiled whole by
    ``jax.jit`` (once per model, ``key`` of static arguments and input
    shape), the model's variables passed in as arguments
    (``keras.StatelessScope``), so the compiled search always reads the
    current weights. Inside a caller's own ``jax.jit`` it is traced as is.
    PyTorch runs it under ``torch.no_grad``."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        with torch.no_grad():
            return run(encoder_tokens, encoder_outputs)
    if backend != "jax" or not hasattr(model, "variables"):
        return run(encoder_tokens, encoder_outputs)
    import jax

    if isinstance(encoder_tokens, jax.core.Tracer) or isinstance(
            encoder_outputs, jax.core.Tracer):
        return run(encoder_tokens, encoder_outputs)
    variables = list(model.variables)
    functions = _COMPILED.setdefault(model, {})
    compiled = functions.get(key)
    if compiled is None:
        def pure(values, encoder_tokens, encoder_outputs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return run(encoder_tokens, encoder_outputs)

        compiled = functions[key] = jax.jit(pure)
    return compiled([variable.value for variable in variables],
                    encoder_tokens, encoder_outputs)


def _check_special_ids(model, start_id, end_id, pad_id):
    """The three special ids as ints in [0, the model's target vocabulary)
    (TypeError/ValueError naming the argument otherwise): START is the
    decoder's first input and PAD fills its later positions, both looked
    up in the target embedding (an id past it read a row of NaN on JAX
    and failed in the embedding elsewhere), END and PAD are output ids."""
    ids = tuple(v.non_negative_int(name, value) for name, value in (
        ("start_id", start_id), ("end_id", end_id), ("pad_id", pad_id)))
    size = int(model.target_vocabulary_size)
    for name, value in zip(("start_id", "end_id", "pad_id"), ids):
        if value >= size:
            raise ValueError(
                f"`{name}` must be an id in [0, {size}) (the model's target "
                f"vocabulary), got {name}={value}")
    return ids


def top_k_rows(values, k):
    """``top_k(values, k)`` for float ``(rows, V)`` with ``k`` much
    smaller than ``V``: the same values and indices in the same order (ties:
    the lower index first), several times faster on CPU.

    The row is cut into chunks of ``c`` ~ sqrt(V / k) entries (the last
    padded with -inf); the ``k`` chunks with the largest maxima (ties: the
    lower chunk) hold the row's ``k`` largest entries, since a chunk left
    out has ``k`` chunks before it, each with an entry that ranks before
    all of its own. Those chunks, taken in index order, are searched with
    ``ops.top_k``, so ties still go to the lower index.

    Args:
        values: float ``(rows, V)``, V static.
        k: int, 1 <= k <= V.

    Returns:
        ``(values (rows, k), indices int32 (rows, k))``, best first.

    Example:

    >>> import numpy as np
    >>> x = np.array([[0., 3., 1., 3., 2., 5., 4., 0., 1.]], "float32")
    >>> v, i = top_k_rows(x, 3)
    >>> np.asarray(v).tolist(), np.asarray(i).tolist()
    ([[5.0, 4.0, 3.0]], [[5, 6, 1]])
    """
    values = ops.convert_to_tensor(values)
    width = int(values.shape[-1])
    chunk = max(8, int((width / k) ** 0.5))
    num_chunks = -(-width // chunk)
    if num_chunks <= k or width < 4 * k * chunk:
        return top_k(values, k)
    pad = num_chunks * chunk - width
    if pad:
        values = ops.pad(values, [[0, 0], [0, pad]],
                         constant_values=-float("inf"))
    chunks = ops.reshape(values, (-1, num_chunks, chunk))
    _, best = top_k(ops.max(chunks, -1), k)
    # Index order: ties go to the lower index.
    best = ops.sort(best, axis=-1)
    candidates = ops.reshape(batch_gather(chunks, best), (-1, k * chunk))
    top_values, at = top_k(candidates, k)
    indices = batch_gather(best, at // chunk) * chunk + at % chunk
    return top_values, indices


STOP_RULES = ("bound", "first_end", "never")


def stop_rule(early_stopping):
    """``early_stopping`` as one of ``STOP_RULES`` (True is ``"bound"``,
    False ``"never"``); ValueError names any other value.

    Example:

    >>> stop_rule(True), stop_rule("first_end")
    ('bound', 'first_end')
    """
    if early_stopping is True or early_stopping is False:
        return "bound" if early_stopping else "never"
    if early_stopping not in STOP_RULES:
        raise ValueError(
            f"`early_stopping` must be True, False or one of {STOP_RULES}, "
            f"got early_stopping={early_stopping!r}")
    return early_stopping


# -- the search strategies -------------------------------------------------

class SearchStrategy:
    """What ``GreedySearch`` and ``BeamSearch`` share: the checks, the
    choice of loop and the compiled run.

    A strategy holds the search's own settings; the model, the source ids
    and the tokenizer's special ids are the call's arguments, so one
    strategy serves any model: ``Translator``, the SavedModel export (its
    translator's), the LiteRT translator and the translation job
    (``TranslationConfig.search()``) take one object. Strategies are
    frozen dataclasses (equal settings, equal strategy: a compiled search
    is reused) with ``get_config`` / ``from_config``.

    Example:

    >>> beam = BeamSearch(beam_size=5, length_penalty=1.2)
    >>> isinstance(beam, SearchStrategy), beam.get_config()["early_stopping"]
    (True, 'bound')
    >>> BeamSearch.from_config(beam.get_config()) == beam
    True
    """

    def get_config(self):
        """The settings as a dict (``from_config`` rebuilds the strategy)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def stepper(self, model, encoder_outputs, encoder_mask, use_cache,
                width=None):
        """The ``Stepper`` of this search's hypotheses per sentence (the
        graph loop's, with ``width=None``, too)."""
        return Stepper(model, encoder_outputs, encoder_mask, use_cache,
                       hypotheses=getattr(self, "beam_size", 1), width=width)

    def _decode(self, model, encoder_tokens, encoder_outputs, ids, use_cache,
                static_cache, return_all=False):
        """Runs the strategy's loop on the checked inputs (see the
        subclasses' ``__call__``): TensorFlow's compacting loop
        (``graph_search``) by default on TensorFlow, the fixed-size loop
        with ``static_cache`` and on the other backends; compiled whole by
        ``jax.jit`` on JAX (``_run``). A batch of no sentence (a static 0
        rows) gives an empty result without running the search, alike on
        every backend."""
        max_decoding_length = check_decoding_length(model,
                                                    self.max_decoding_length)
        ids = _check_special_ids(model, *ids)
        pad_id = ids[2]
        encoder_tokens = _check_tokens(encoder_tokens, model)
        encoder_outputs = _check_encoder_outputs(model, encoder_outputs,
                                                 encoder_tokens)
        if encoder_tokens.shape[0] == 0:
            steps, _ = decode_length(model, encoder_tokens,
                                     max_decoding_length, pad_id)
            best = ops.zeros((0, steps), "int32")
            if not return_all:
                return best
            k = self.beam_size
            return (best, ops.zeros((0, k, steps), "int32"),
                    ops.zeros((0, k), "float32"))
        loop = self._static_loop
        if _is_tensorflow() and not static_cache:
            from keras_trm.decoding import graph_search

            loop = functools.partial(getattr(graph_search, self._GRAPH_LOOP),
                                     self)

        def run(encoder_tokens, encoder_outputs):
            steps, limits = decode_length(model, encoder_tokens,
                                          max_decoding_length, pad_id)
            if encoder_outputs is None:
                encoder_outputs = model.encode(encoder_tokens)
            return loop(model, encoder_tokens, encoder_outputs, steps, limits,
                        ids, use_cache, return_all)

        return _run(model, (self, ids, use_cache, return_all), run,
                    encoder_tokens, encoder_outputs)


def _set_max_decoding_length(strategy):
    """The strategy's ``max_decoding_length`` as None or an int >= 1 (the
    model's range is checked at the call)."""
    value = strategy.max_decoding_length
    if value is not None:
        object.__setattr__(strategy, "max_decoding_length",
                           v.positive_int("max_decoding_length", value))


@dataclasses.dataclass(frozen=True)
class GreedySearch(SearchStrategy):
    """Greedy decoding: the arg-max token at every step (PAD excluded: no
    search emits it).

    On TensorFlow (graph or eager) rows whose sentence has ended leave the
    decoder's batch, except with ``static_cache``, so a batch costs what
    its sentences need, not its longest sentence times its size.

    Args:
        max_decoding_length: int, tokens to generate at most per sentence
            (default None: the sentence's own source length, END included,
            + 50 (§6.1), capped by the model's max_sequence_length - 1).
            The output is as wide as the longest limit; a row stops at END
            or at its limit.

    Raises:
        TypeError / ValueError: ``max_decoding_length`` not an int >= 1
            (checked against the model's positions at the call).

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    ...                     max_sequence_length=12)
    >>> source = np.array([[5, 6, 3], [7, 3, 0]], "int32")   # ids + END, 0-padded
    >>> search = GreedySearch(max_decoding_length=6)
    >>> ids = search(model, source)
    >>> tuple(ids.shape), keras.backend.standardize_dtype(ids.dtype)
    ((2, 6), 'int32')
    >>> bool(np.array_equal(ids, search(model, source, use_cache=False)))
    True
    """

    max_decoding_length: Optional[int] = None

    def __post_init__(self):
        _set_max_decoding_length(self)

    def __call__(self, model, encoder_tokens, encoder_outputs=None, *,
                 start_id=START_ID, end_id=END_ID, pad_id=PAD_ID,
                 use_cache=True, static_cache=False):
        """Greedy ids for a batch of source sentences.

        Args:
            model: a ``keras_trm.models.Transformer`` (or any
                ``DecodingModel``).
            encoder_tokens: int ``(batch, T_src)`` source ids (``pad_id`` =
                padding), T_src >= 1 (a zero-width source is refused); a
                batch of 0 sentences (any width) gives an empty result
                without searching.
            encoder_outputs: optional float ``(batch, T_src, d_model)``,
                ``model.encode(encoder_tokens)`` computed already (e.g. by
                ``encode_by_length``); by default the search encodes. Its
                static shape must match ``encoder_tokens`` and the model's
                d_model.
            start_id, end_id, pad_id: the tokenizer's ``[START]``,
                ``[END]`` and padding ids, ints in [0,
                ``model.target_vocabulary_size``) (default:
                ``keras_trm.text``'s reserved ids, START 2, END 3, PAD 0).
                The decoder starts from ``start_id``, a sentence stops at
                ``end_id``; ``pad_id`` marks the source's padding and fills
                the output after END (the ``keras_trm`` models' own
                attention masks take id 0 as padding).
            use_cache: use the key/value cache (False: recompute the prefix
                at every step, the baseline the tests compare against).
            static_cache: on TensorFlow, the fixed-size loop over
                ``decode_step``'s fixed-size caches (static shapes, for
                ``tf.function(jit_compile=True)``); by default the caches
                grow by one position per step and finished sentences leave
                the batch (faster in graph mode). The ids are the same
                either way; JAX and PyTorch always run the fixed-size loop.

        Returns:
            int32 ``(batch, steps)`` generated ids (without START); after
            END every position is ``pad_id``. For 0 sentences, int32
            ``(0, steps)``.
        Raises:
            TypeError: non-integer ids, a non-int special id, non-float
                ``encoder_outputs``.
            ValueError: bad shapes (a zero-width source,
                ``encoder_outputs`` whose batch, width or d_model does not
                match), special ids outside [0, the target vocabulary),
                ``max_decoding_length`` past the model's positions, or
                host (NumPy) ids outside the source vocabulary. Each
                message names the argument and its value.
        """
        return self._decode(model, encoder_tokens, encoder_outputs,
                            (start_id, end_id, pad_id), use_cache,
                            static_cache)

    def update(self, logits, finished, i, limits, end_id, pad_id):
        """One step for the rows given (both loops run it): ``(token,
        finished)``, the arg-max token (``pad_id`` where the row had
        finished) and whether each row has now ended (``end_id``, or its
        token limit). It never emits PAD (fairseq's rule): a PAD would end
        the row without END and read as padding at the next step."""
        if _is_tensorflow():
            # Keras' float argmax adds four element-wise passes over the
            # (rows, V) logits (a -0.0 fix-up): greedy ran 0.960x the
            # TensorFlow-only search with it, 1.002x with tf.argmax
            # (bench/ab.py search, bench/results/search_keras_ops_ab.json).
            import tensorflow as tf

            token = tf.argmax(logits, axis=-1, output_type=tf.int32)
        else:
            token = ops.cast(ops.argmax(logits, axis=-1), "int32")
        # Rarely true (a trained model's arg-max is not PAD), so the pass
        # over (rows, V) runs only then: 0.95x when it ran every step.
        token = ops.cond(
            ops.any(ops.equal(token, pad_id)),
            lambda: ops.cast(ops.argmax(ops.where(
                ops.equal(ops.arange(ops.shape(logits)[-1], dtype="int32"),
                          pad_id), float("-inf"), logits), axis=-1), "int32"),
            lambda: token)
        token = ops.where(finished, pad_id, token)
        finished = ops.logical_or(
            finished, ops.logical_or(ops.equal(token, end_id),
                                     ops.greater_equal(i + 1, limits)))
        return token, finished

    _GRAPH_LOOP = "greedy"  # graph_search's loop

    def _static_loop(self, model, encoder_tokens, encoder_outputs, steps,
                     limits, ids, use_cache, return_all):
        start_id, end_id, pad_id = ids
        batch = ops.shape(encoder_tokens)[0]
        encoder_mask = ops.not_equal(encoder_tokens, pad_id)
        stepper = self.stepper(model, encoder_outputs, encoder_mask,
                               use_cache, width=steps + 1)
        sequences = ops.concatenate(
            [ops.full((batch, 1), start_id, "int32"),
             ops.full((batch, steps), pad_id, "int32")], axis=1)
        columns = ops.arange(steps + 1, dtype="int32")[None]

        def cond(i, sequences, finished, state):
            return ops.logical_and(i < steps,
                                   ops.logical_not(ops.all(finished)))

        def body(i, sequences, finished, state):
            logits, state = stepper(sequences, i, state)
            token, finished = self.update(logits, finished, i, limits,
                                          end_id, pad_id)
            sequences = ops.where(ops.equal(columns, i + 1),
                                  ops.expand_dims(token, 1), sequences)
            return i + 1, sequences, finished, state

        loop_vars = (ops.convert_to_tensor(0, "int32"), sequences,
                     ops.zeros((batch,), "bool"), stepper.initial_state)
        _, sequences, _, _ = ops.while_loop(cond, body, loop_vars)
        return sequences[:, 1:]


@dataclasses.dataclass(frozen=True)
class BeamSearch(SearchStrategy):
    """Beam search with the GNMT length penalty and a beam kept full.

    Keeps ``beam_size`` = k live hypotheses per sentence at every step: of
    the 2k best extensions, those ending in END among the first k join a set
    of the k best finished ones (fairseq), the k best others stay live;
    PAD is never an extension (fairseq's rule; scores stay the model's
    log-probs). A sentence stops once its best live log P / lp(limit)
    cannot beat its best finished score (tensor2tensor), or at its token
    limit, so with ``beam_size`` k the result is the exact best whenever
    the k-slot beam can reach it (tests compare with exhaustive search).
    ``beam_size=1`` gives greedy search's ids at every α (its one slot stops
    at the first END; ``GreedySearch`` is faster). A sentence that has
    stopped is frozen while others in the batch go on, so batched and
    one-by-one decoding agree.

    Args:
        beam_size: int >= 1 (4 in the paper).
        length_penalty: the GNMT α, a finite float >= 0 (0.6 in the
            paper; 0 = raw log-prob).
        early_stopping: when a sentence stops: True or ``"bound"``, as
            soon as no live hypothesis can beat its best finished one
            (exact); ``"first_end"``, also at the first step whose best
            candidate ends (CTranslate2's early exit: fewer steps, exact
            only for α = 0); False or ``"never"``, at its token limit
            (the best hypothesis is that of ``"bound"``). Kept as the rule's
            name.
        max_decoding_length: as in ``GreedySearch`` (a limit per
            sentence); a hypothesis that reaches its limit without END is
            finished with |Y| = the limit.

    Raises:
        TypeError: ``beam_size`` not an int, ``length_penalty`` not a real
            number (a bool or a string included), ``max_decoding_length``
            not an int.
        ValueError: beam_size < 1, α < 0, NaN or inf, an unknown
            ``early_stopping``, ``max_decoding_length`` < 1.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    ...                     max_sequence_length=12)
    >>> source = np.array([[5, 6, 3], [7, 3, 0]], "int32")
    >>> search = BeamSearch(beam_size=3, max_decoding_length=6)
    >>> best, beams, scores = search(model, source, return_all=True)
    >>> tuple(best.shape), tuple(beams.shape), tuple(scores.shape)
    ((2, 6), (2, 3, 6), (2, 3))
    >>> scores = np.asarray(scores)
    >>> bool(np.all(scores[:, :-1] >= scores[:, 1:]))   # best first
    True
    >>> bool(np.array_equal(
    ...     BeamSearch(beam_size=1, max_decoding_length=6)(model, source),
    ...     GreedySearch(max_decoding_length=6)(model, source)))
    True
    >>> # CTranslate2's stopping rule: fewer steps, exact only for alpha = 0
    >>> first_end = BeamSearch(3, length_penalty=0.0, early_stopping="first_end",
    ...                        max_decoding_length=6)
    >>> bool(np.array_equal(first_end(model, source), BeamSearch(
    ...     3, length_penalty=0.0, max_decoding_length=6)(model, source)))
    True
    """

    beam_size: int = 4
    length_penalty: float = 0.6
    early_stopping: Union[bool, str] = True
    max_decoding_length: Optional[int] = None

    def __post_init__(self):
        set_field = functools.partial(object.__setattr__, self)
        set_field("beam_size", v.positive_int("beam_size", self.beam_size))
        # A finite α >= 0: NaN scored every hypothesis NaN, and inf divided
        # every score by inf (a string or a bool was read as a number).
        set_field("length_penalty", v.non_negative_float(
            "length_penalty", self.length_penalty))
        set_field("early_stopping", stop_rule(self.early_stopping))
        _set_max_decoding_length(self)

    def __call__(self, model, encoder_tokens, encoder_outputs=None, *,
                 start_id=START_ID, end_id=END_ID, pad_id=PAD_ID,
                 use_cache=True, static_cache=False, return_all=False):
        """The best hypothesis (or the k best) for a batch of source
        sentences. The arguments are ``GreedySearch.__call__``'s, and:

        Args:
            return_all: also return the k best hypotheses and their
                normalized scores.

        Returns:
            int32 ``(batch, steps)`` best hypothesis per sentence (without
            START, ``pad_id`` after END); with ``return_all`` the tuple
            ``(best, beams (batch, beam_size, steps), scores (batch,
            beam_size))`` sorted best first: the finished hypotheses (END
            or the limit), then, if fewer than k finished, the best live
            ones at the stop, scored by their length so far. Slots no
            hypothesis reached score about -1e9. For 0 sentences, the same
            with a batch of 0.

        Raises:
            As ``GreedySearch.__call__``.
        """
        return self._decode(model, encoder_tokens, encoder_outputs,
                            (start_id, end_id, pad_id), use_cache,
                            static_cache, return_all)

    STATE_KEYS = ("alive_seq", "alive_logp", "finished_seq", "finished_score",
                  "finished_flag", "done", "alive_len")

    def initial_state(self, batch, steps, start_id, pad_id):
        """The search state of ``batch`` sentences before step 0 (a dict of
        ``STATE_KEYS``). Only beam 0 is live (all k beams are the same
        prefix, START); positions not yet written hold ``pad_id``."""
        k = self.beam_size
        alive_seq = ops.concatenate(
            [ops.full((batch, k, 1), start_id, "int32"),
             ops.full((batch, k, steps), pad_id, "int32")], axis=2)
        first = ops.convert_to_tensor([[0.0] + [NEG_INF] * (k - 1)], "float32")
        return dict(
            alive_seq=alive_seq,
            alive_logp=ops.tile(first, (batch, 1)),
            finished_seq=ops.full(ops.shape(alive_seq), pad_id, "int32"),
            finished_score=ops.full((batch, k), NEG_INF, "float32"),
            finished_flag=ops.zeros((batch, k), "bool"),
            done=ops.zeros((batch,), "bool"),
            alive_len=ops.zeros((batch,), "int32"),  # tokens of the live ones
        )

    def update(self, state, logits, i, limits, max_penalties, end_id, pad_id,
               vocab):
        """One step for the n sentences of ``state`` (both loops run it).

        Args:
            state: dict of ``STATE_KEYS``, one row per sentence.
            logits: float ``(n * k, V)``, the step's logits of each
                hypothesis.
            i: int scalar, the step (position ``i + 1`` is written).
            limits, max_penalties: ``(n,)`` each sentence's token limit and
                lp(limit).
            end_id, pad_id: the END and PAD ids; vocab: V (a Python int).

        Returns:
            ``(state, parent)``: the new state and, per live slot, the slot
            it continues (int ``(n, k)``): the decoder rows to reorder.
        """
        k, rule = self.beam_size, self.early_stopping
        (alive_seq, alive_logp, finished_seq, finished_score, finished_flag,
         done, alive_len) = (state[key] for key in self.STATE_KEYS)
        # 2k candidates: at most k of them (one per live hypothesis) end, so
        # at least k remain live.
        num_candidates = min(2 * k, k * vocab)
        # One more per row than needed: PAD, never emitted (fairseq's
        # rule), may be among them and is dropped.
        per_row = min(num_candidates + 1, vocab)
        # The model's log-probs (not renormalized without PAD: fairseq).
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        # The 2k best of the k * V are among the 2k best of each hypothesis:
        # top-k over k rows of V, then over k * 2k gives one top-k's
        # candidates in its order (ties: lower hypothesis, then lower
        # token); a row's log P is added to its 2k picks only.
        row_logp, row_token = top_k_rows(log_probs, per_row)
        row_logp = ops.where(ops.equal(row_token, pad_id), float("-inf"),
                             row_logp)
        row_logp = ops.expand_dims(alive_logp, 2) + ops.reshape(
            row_logp, (-1, k, per_row))
        cand_logp, top = top_k(ops.reshape(row_logp, (-1, k * per_row)),
                               num_candidates)
        cand_beam = top // per_row
        cand_token = batch_gather(ops.reshape(row_token, (-1, k * per_row)),
                                  top)
        cand_seq = batch_gather(alive_seq, cand_beam)
        write = ops.equal(ops.arange(ops.shape(alive_seq)[2], dtype="int32"),
                          i + 1)
        cand_seq = ops.where(write, ops.expand_dims(cand_token, 2), cand_seq)
        ended = ops.equal(cand_token, end_id)
        live = ops.expand_dims(ops.logical_not(done), 1)
        # END counts only among the k best candidates (fairseq): an END
        # ranked below k live extensions is dropped, so beam 1 with α = 0
        # is greedy search.
        in_top_k = ops.expand_dims(ops.arange(num_candidates) < k, 0)

        # The k best that have not ended stay live.
        _, keep = top_k(ops.where(ended, -float("inf"), cand_logp), k)
        new_logp = batch_gather(cand_logp, keep)
        new_seq = batch_gather(cand_seq, keep)
        parent = batch_gather(cand_beam, keep)

        # Those that end join the k best finished (sentences not yet done).
        new_finished = (ended & in_top_k & live & (cand_logp > NEG_INF / 2))
        end_score = ops.where(new_finished, cand_logp / self.penalty(i + 1),
                              NEG_INF)
        pool_score = ops.concatenate([finished_score, end_score], 1)
        pool_flag = ops.concatenate([finished_flag, new_finished], 1)
        pool_seq = ops.concatenate([finished_seq, cand_seq], 1)
        finished_score, best = top_k(pool_score, k)
        finished_flag = batch_gather(pool_flag, best)
        finished_seq = batch_gather(pool_seq, best)

        # Sentences already done keep their live hypotheses as they were
        # (the graph search drops them instead).
        alive_seq = ops.where(ops.expand_dims(live, 2), new_seq, alive_seq)
        alive_logp = ops.where(live, new_logp, alive_logp)
        alive_len = ops.where(live[:, 0], i + 1, alive_len)
        parent = ops.where(live, parent, ops.arange(k, dtype="int32")[None])

        # A sentence whose hypotheses reached its token limit is done (the
        # live ones count as finished at the end).
        done = done | ops.greater_equal(i + 1, limits)
        if rule != "never":
            # Done when no live hypothesis can still beat the best finished
            # one: log P only falls and lp(|Y|) <= lp(its limit)
            # (tensor2tensor's bound, exact).
            bound = ops.max(alive_logp, 1) / max_penalties
            done = done | (ops.max(finished_score, 1) >= bound)
        if rule == "first_end":
            # Or when the best candidate of this step ends (CTranslate2).
            done = done | new_finished[:, 0]
        if k == 1:
            # Beam 1 is greedy search: its one slot is done at the first END
            # (else, with α > 0, it would search on past greedy's END).
            done = done | finished_flag[:, 0]
        state = dict(alive_seq=alive_seq, alive_logp=alive_logp,
                     finished_seq=finished_seq, finished_score=finished_score,
                     finished_flag=finished_flag, done=done,
                     alive_len=alive_len)
        return state, parent

    def result(self, state, limits, return_all):
        """The best hypotheses once the loop has stopped (the call's
        result)."""
        k = self.beam_size
        (alive_seq, alive_logp, finished_seq, finished_score, finished_flag, _,
         alive_len) = (state[key] for key in self.STATE_KEYS)
        # Live hypotheses that reached their limit are finished; others only
        # fill the slots the finished ones leave.
        alive_score = alive_logp / ops.expand_dims(
            self.penalty(ops.maximum(alive_len, 1)), 1)
        at_max = (ops.expand_dims(ops.equal(alive_len, limits), 1)
                  & (alive_logp > NEG_INF / 2))
        pool_seq = ops.concatenate([finished_seq, alive_seq], 1)
        pool_score = ops.concatenate([finished_score, alive_score], 1)
        pool_rank = ops.concatenate([finished_flag, at_max], 1)
        order = _stable_order(pool_rank, pool_score)[:, :k]
        beams = batch_gather(pool_seq, order)[:, :, 1:]
        best = beams[:, 0]
        if return_all:
            return best, beams, batch_gather(pool_score, order)
        return best

    def penalty(self, length):
        """lp(``length``) of this search's α (``length_penalty``)."""
        return length_penalty(length, self.length_penalty)

    _GRAPH_LOOP = "beam"

    def _static_loop(self, model, encoder_tokens, encoder_outputs, steps,
                     limits, ids, use_cache, return_all):
        start_id, end_id, pad_id = ids
        k = self.beam_size
        batch = ops.shape(encoder_tokens)[0]
        vocab = int(model.target_vocabulary_size)
        encoder_mask = ops.not_equal(encoder_tokens, pad_id)
        stepper = self.stepper(model, encoder_outputs, encoder_mask,
                               use_cache, width=steps + 1)
        max_penalties = self.penalty(limits)
        row_offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * k, 1)

        def cond(i, search, state):
            return ops.logical_and(i < steps,
                                   ops.logical_not(ops.all(search["done"])))

        def body(i, search, state):
            flat = ops.reshape(search["alive_seq"], (-1, steps + 1))
            logits, state = stepper(flat, i, state)
            search, parent = self.update(search, logits, i, limits,
                                         max_penalties, end_id, pad_id, vocab)
            # Each live hypothesis continues its parent's decoder rows.
            state = _reorder(state, ops.reshape(parent + row_offsets, (-1,)))
            return i + 1, search, state

        loop_vars = (ops.convert_to_tensor(0, "int32"),
                     self.initial_state(batch, steps, start_id, pad_id),
                     stepper.initial_state)
        _, search, _ = ops.while_loop(cond, body, loop_vars)
        return self.result(search, limits, return_all)


def check_search(model, search):
    """``search`` as a ``SearchStrategy`` for ``model`` (None: the paper's
    ``BeamSearch()``): a ``TypeError`` for anything else, a ``ValueError``
    for a ``max_decoding_length`` past the model's positions (now, not at
    the first translation)."""
    if search is None:
        return BeamSearch()
    if not isinstance(search, SearchStrategy):
        raise TypeError(
            "`search` must be a search strategy (keras_trm.decoding."
            "BeamSearch(...) or GreedySearch(...)), got "
            f"search={search!r} of type {type(search).__name__}")
    check_decoding_length(model, search.max_decoding_length)
    return search


def search_strategy(beam_size=4, length_penalty=0.6, early_stopping=True,
                    max_decoding_length=None):
    """The strategy of the flat settings a config or a command line gives:
    ``GreedySearch`` for ``beam_size`` 1 (the same ids as a beam of 1,
    faster), ``BeamSearch`` otherwise. Raises as ``BeamSearch`` does.

    Example:

    >>> search_strategy(1)
    GreedySearch(max_decoding_length=None)
    >>> search_strategy(5, length_penalty=1.2).beam_size
    5
    """
    beam = BeamSearch(beam_size, length_penalty, early_stopping,
                      max_decoding_length)
    if beam.beam_size == 1:
        return GreedySearch(max_decoding_length)
    return beam
