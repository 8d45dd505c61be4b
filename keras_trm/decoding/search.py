"""Greedy and beam search over a key/value cache.

Both run as one ``tf.while_loop``: the encoder runs once, its keys/values are
projected once per decoder layer (``cross_attention_caches``), and each step
feeds one token per hypothesis, writing its keys/values into a fixed-size
self-attention cache, so past positions are never recomputed. Cache shapes
do not change inside the loop (XLA can compile it when ``max_length`` is a
Python int). ``use_cache=False`` re-runs the decoder over the whole prefix at
every step instead (the baseline the benchmark compares against).

Beam search ranks hypotheses by log P(Y|X) / lp(Y) with the length penalty
of Wu et al. (2016), Eq. 14: lp(Y) = ((5 + |Y|) / 6)^α; Vaswani et al.
(2017) §6.1 use beam size 4 and α = 0.6. A hypothesis that emits END keeps
its score and length and is extended only by padding; the search stops when
the best-ranked hypothesis of every sentence has ended (or after
``max_length`` steps).
"""

import tensorflow as tf

from keras_trm.text.wordpiece import END_ID, PAD_ID, START_ID

NEG_INF = -1e9


def length_penalty(length, alpha):
    """Wu et al. (2016) Eq. 14: ((5 + length) / 6) ** alpha (float32)."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _check_tokens(encoder_tokens):
    encoder_tokens = tf.convert_to_tensor(encoder_tokens)
    if not encoder_tokens.dtype.is_integer:
        raise TypeError(
            "`encoder_tokens` must be integer token ids, got dtype "
            f"{encoder_tokens.dtype.name}"
        )
    if encoder_tokens.shape.rank != 2:
        raise ValueError(
            "`encoder_tokens` must have shape (batch, T_src), got "
            f"{encoder_tokens.shape}"
        )
    return tf.cast(encoder_tokens, tf.int32)


def _decode_length(parts, encoder_tokens, max_length):
    """Steps to run: min(T_src + 50 (§6.1), model max_length - 1) by default."""
    if max_length is None:
        src_len = tf.shape(encoder_tokens)[1]
        return tf.minimum(src_len + 50, parts.max_length - 1)
    if not 0 < int(max_length) < parts.max_length:
        raise ValueError(
            f"`max_length` must be in [1, {parts.max_length - 1}] for this "
            f"model (max_length {parts.max_length} positions incl. START), "
            f"got max_length={max_length}"
        )
    return int(max_length)


class _Stepper:
    """Runs the decoder one position at a time, with or without a cache."""

    def __init__(self, parts, encoder_outputs, encoder_mask, steps, use_cache):
        self.parts = parts
        self.encoder_outputs = encoder_outputs
        self.encoder_mask = encoder_mask
        self.use_cache = use_cache
        if use_cache:
            self.cross = parts.cross_attention_caches(encoder_outputs)
            batch = tf.shape(encoder_outputs)[0]
            self.initial_state = parts.empty_self_attention_caches(
                batch, steps, encoder_outputs.dtype
            )
        else:
            self.initial_state = []

    def __call__(self, sequences, index, state):
        """sequences: (N, steps+1) ids; returns logits (N, V) at ``index``."""
        if self.use_cache:
            tokens = sequences[:, index:index + 1]
            return self.parts.decode_step(
                tokens, index, state, self.cross, self.encoder_mask
            )
        prefix = sequences[:, : index + 1]
        logits = self.parts.decode_full(
            prefix, self.encoder_outputs, self.encoder_mask
        )
        return logits[:, -1, :], state

    def reorder(self, state, flat_indices):
        return [tf.gather(c, flat_indices) for c in state]


def greedy_search(parts, encoder_tokens, max_length=None, use_cache=True):
    """Greedy decoding: the arg-max token at every step.

    Args:
        parts: ``keras_trm.models.TransformerParts`` of a trained model.
        encoder_tokens: int ``(batch, T_src)`` source ids (0 = padding).
        max_length: int, tokens to generate at most (default T_src + 50,
            capped by the model's max_length - 1).
        use_cache: use the key/value cache (False: recompute the prefix).

    Returns:
        int32 ``(batch, steps)`` generated ids (without START); after END
        every position is PAD (0).

    Raises:
        TypeError: non-integer ids. ValueError: bad shapes or max_length.
    """
    encoder_tokens = _check_tokens(encoder_tokens)
    steps = _decode_length(parts, encoder_tokens, max_length)
    batch = tf.shape(encoder_tokens)[0]
    encoder_mask = tf.not_equal(encoder_tokens, PAD_ID)
    encoder_outputs = parts.encode(encoder_tokens)
    stepper = _Stepper(parts, encoder_outputs, encoder_mask, steps + 1, use_cache)

    sequences = tf.concat(
        [tf.fill([batch, 1], START_ID), tf.zeros([batch, steps], tf.int32)], 1
    )
    finished = tf.zeros([batch], tf.bool)

    def cond(i, sequences, finished, state):
        return tf.logical_and(i < steps, tf.logical_not(tf.reduce_all(finished)))

    def body(i, sequences, finished, state):
        logits, state = stepper(sequences, i, state)
        token = tf.argmax(logits, axis=-1, output_type=tf.int32)
        token = tf.where(finished, PAD_ID, token)
        sequences = tf.tensor_scatter_nd_update(
            sequences,
            tf.stack([tf.range(batch), tf.fill([batch], i + 1)], 1),
            token,
        )
        return i + 1, sequences, finished | tf.equal(token, END_ID), state

    _, sequences, _, _ = tf.while_loop(
        cond, body, (tf.constant(0), sequences, finished, stepper.initial_state)
    )
    return sequences[:, 1:]


def beam_search(
    parts,
    encoder_tokens,
    beam_size=4,
    length_penalty_alpha=0.6,
    max_length=None,
    use_cache=True,
    return_all=False,
):
    """Beam search with the GNMT length penalty.

    Args:
        parts: ``keras_trm.models.TransformerParts``.
        encoder_tokens: int ``(batch, T_src)``.
        beam_size: int >= 1 (4 in the paper).
        length_penalty_alpha: α >= 0 (0.6 in the paper; 0 = raw log-prob).
        max_length: as in ``greedy_search``.
        use_cache: as in ``greedy_search``.
        return_all: also return every beam and its normalized score.

    Returns:
        int32 ``(batch, steps)`` best hypothesis per sentence (without
        START, PAD after END); with ``return_all`` the tuple
        ``(best, beams (batch, beam_size, steps), scores (batch, beam_size))``
        with beams sorted best first.

    Raises:
        ValueError: beam_size < 1, α < 0, bad shapes or max_length.
    """
    if int(beam_size) < 1:
        raise ValueError(f"`beam_size` must be >= 1, got beam_size={beam_size}")
    if float(length_penalty_alpha) < 0:
        raise ValueError(
            "`length_penalty_alpha` must be >= 0, got "
            f"length_penalty_alpha={length_penalty_alpha}"
        )
    k = int(beam_size)
    alpha = float(length_penalty_alpha)
    encoder_tokens = _check_tokens(encoder_tokens)
    steps = _decode_length(parts, encoder_tokens, max_length)
    batch = tf.shape(encoder_tokens)[0]
    vocab = parts.vocabulary_size

    # Encode once, then give each of the k hypotheses its own row.
    encoder_mask = tf.not_equal(encoder_tokens, PAD_ID)
    encoder_outputs = parts.encode(encoder_tokens)
    encoder_outputs = tf.repeat(encoder_outputs, k, axis=0)
    encoder_mask = tf.repeat(encoder_mask, k, axis=0)
    stepper = _Stepper(parts, encoder_outputs, encoder_mask, steps + 1, use_cache)

    sequences = tf.concat(
        [tf.fill([batch, k, 1], START_ID), tf.zeros([batch, k, steps], tf.int32)],
        2,
    )
    # Only beam 0 is live at the start (all k beams are the same prefix).
    scores = tf.tile(
        tf.constant([[0.0] + [NEG_INF] * (k - 1)], tf.float32), [batch, 1]
    )
    finished = tf.zeros([batch, k], tf.bool)
    lengths = tf.zeros([batch, k], tf.int32)
    # Log-probabilities a finished hypothesis may take: PAD at no cost.
    pad_only = tf.one_hot(PAD_ID, vocab, on_value=0.0, off_value=NEG_INF)
    batch_offsets = (tf.range(batch) * k)[:, None]

    def cond(i, sequences, scores, finished, lengths, state):
        # Beams are kept sorted by normalized score: stop once the best
        # hypothesis of every sentence has ended (as OpenNMT-py does).
        return tf.logical_and(
            i < steps, tf.logical_not(tf.reduce_all(finished[:, 0]))
        )

    def body(i, sequences, scores, finished, lengths, state):
        flat = tf.reshape(sequences, [batch * k, -1])
        logits, state = stepper(flat, i, state)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        log_probs = tf.reshape(log_probs, [batch, k, vocab])
        log_probs = tf.where(finished[:, :, None], pad_only, log_probs)

        candidates = scores[:, :, None] + log_probs  # (batch, k, V)
        cand_len = tf.where(finished, lengths, i + 1)  # (batch, k)
        normalized = candidates / length_penalty(cand_len, alpha)[:, :, None]
        _, top = tf.math.top_k(tf.reshape(normalized, [batch, k * vocab]), k)
        beam = top // vocab
        token = top % vocab

        scores = tf.gather(tf.reshape(candidates, [batch, k * vocab]), top,
                           batch_dims=1)
        was_finished = tf.gather(finished, beam, batch_dims=1)
        lengths = tf.gather(cand_len, beam, batch_dims=1)
        finished = was_finished | tf.equal(token, END_ID)
        sequences = tf.gather(sequences, beam, batch_dims=1)
        write = tf.equal(tf.range(tf.shape(sequences)[2]), i + 1)
        sequences = tf.where(write, token[:, :, None], sequences)
        state = stepper.reorder(state, tf.reshape(beam + batch_offsets, [-1]))
        return i + 1, sequences, scores, finished, lengths, state

    _, sequences, scores, finished, lengths, _ = tf.while_loop(
        cond,
        body,
        (tf.constant(0), sequences, scores, finished, lengths,
         stepper.initial_state),
        shape_invariants=(
            tf.TensorShape([]),
            tf.TensorShape([None, k, None]),
            tf.TensorShape([None, k]),
            tf.TensorShape([None, k]),
            tf.TensorShape([None, k]),
            [tf.TensorShape(s.shape) for s in stepper.initial_state],
        ),
    )
    final = scores / length_penalty(tf.maximum(lengths, 1), alpha)
    order = tf.argsort(final, axis=1, direction="DESCENDING")
    beams = tf.gather(sequences, order, batch_dims=1)[:, :, 1:]
    best = beams[:, 0]
    if return_all:
        return best, beams, tf.gather(final, order, batch_dims=1)
    return best
