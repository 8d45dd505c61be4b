"""Greedy and beam search over a key/value cache.

Both run as one ``tf.while_loop``: the encoder runs once, its keys/values are
projected once per decoder layer (``cross_attention_caches``), and each
step feeds one token per hypothesis, appending its keys/values to a
head-major self-attention cache ``(batch, h, positions, d_k)`` that grows by
one position per step (``Transformer.decode_step``): past
positions are never recomputed, and writing, reading and reordering the
cache costs only the positions decoded so far (beam search decodes step 0,
where a sentence's k hypotheses are all START, as one row per sentence;
not with ``static_cache``, where XLA would compile the step twice for no
measurable gain).
``static_cache=True`` runs the same step over caches ``steps`` positions
long from the start (``static_decode_step``, writing at the position),
whose shapes never change inside the loop (XLA compiles it, once per
input shape: ``Translator(jit_compile=True)``); the ids are the same. ``use_cache=False``
re-runs the decoder over the whole prefix at every step instead (the
baseline the benchmark compares against).

Beam search ranks hypotheses by log P(Y|X) / lp(Y) with the length penalty
of Wu et al. (2016), Eq. 14: lp(Y) = ((5 + |Y|) / 6)^α, |Y| the number of
generated tokens (END included); Vaswani et al. (2017) §6.1 use beam size 4
and α = 0.6. The beam stays full, as in tensor2tensor's ``beam_search.py``
and fairseq's ``SequenceGenerator``: every step takes the 2k best
extensions of the k live hypotheses, moves those that end with END (and
rank among the first k, as in fairseq) into a per-sentence set of the k
best finished hypotheses, and goes on with the k best that have not ended.
Each sentence has a token limit: its own source length (END included,
padding not) + 50, as in §6.1, capped by the model's positions (or the
``max_length`` given), so a sentence decodes alike alone or in any batch.
A hypothesis that reaches the limit without END is finished with |Y| = the
limit (fairseq). A sentence stops when no live hypothesis can still beat
its best finished one: log-probabilities only decrease and lp only grows,
so a live hypothesis can at best reach log P / lp(limit) (tensor2tensor's
bound; log P itself for α = 0). The stop is exact: it returns the best
hypothesis that running to the limit would return.
``early_stopping="first_end"`` adds CTranslate2's early exit: a sentence
also stops at the first step whose best candidate (by log P) ends. For α = 0 that changes nothing (that
candidate already beats every live one); for α > 0 a longer hypothesis
could still have won, so outputs may differ, for fewer steps (measured in
``bench/results/decoding_val.json``).
``beam_size=1`` is greedy search (its one slot stops at the first END).
"""

import tensorflow as tf

from keras_trm.layers import _validation as v
from keras_trm.text.wordpiece import END_ID, PAD_ID, START_ID

NEG_INF = -1e9


def length_penalty(length, alpha):
    """Wu et al. (2016) Eq. 14: ((5 + length) / 6) ** alpha (float32).

    Example:

    >>> float(length_penalty(1, 0.6))   # ((5 + 1) / 6) ** 0.6
    1.0
    >>> round(float(length_penalty(7, 1.0)), 4)
    2.0
    """
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _check_tokens(encoder_tokens):
    encoder_tokens = tf.convert_to_tensor(encoder_tokens)
    v.integer_ids("encoder_tokens", encoder_tokens)
    if encoder_tokens.shape.rank != 2:
        raise ValueError(
            "`encoder_tokens` must have shape (batch, T_src), got "
            f"{encoder_tokens.shape}"
        )
    return tf.cast(encoder_tokens, tf.int32)


def encode_by_length(model, encoder_tokens, groups=4):
    """``model.encode(encoder_tokens)`` with less padding.

    The sentences, sorted by length, are encoded in ``groups`` groups of
    about batch / groups, each padded only to its own longest sentence,
    and put back in order: the encoder's work follows the sentences'
    lengths rather than batch x the longest. Padding positions hold what
    the group's encoding gives there, zeros past the group's longest;
    neither is ever attended (every attention masks padding). The values at real positions are those
    of ``model.encode`` up to float rounding (masked keys add exact zeros);
    the searches' ids were identical for 1,000 of 1,000 Multi30k val and
    test sentences (``bench/results/encode_by_length.json``). Shapes vary
    with the lengths, so this is for graph mode, not XLA.

    Args:
        model: a ``keras_trm.models.Transformer``.
        encoder_tokens: int ``(batch, T_src)`` source ids (0 = padding).
        groups: int >= 1, the groups (1: ``model.encode`` as it is).

    Returns:
        float ``(batch, T_src, d_model)``, as ``model.encode``.

    Raises:
        TypeError: non-integer ids. ValueError: bad shapes, ``groups`` < 1.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    ...                     max_length=12)
    >>> source = np.array([[5, 6, 7, 8, 3], [7, 3, 0, 0, 0]], "int32")
    >>> grouped = encode_by_length(model, source, groups=2)
    >>> tuple(grouped.shape)
    (2, 5, 16)
    >>> bool(np.allclose(grouped[1, :2], model.encode(source)[1, :2], atol=1e-5))
    True
    """
    encoder_tokens = _check_tokens(encoder_tokens)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"`groups` must be an int >= 1, got groups={groups!r}")
    if groups == 1:
        return model.encode(encoder_tokens)
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(encoder_tokens, PAD_ID),
                                    tf.int32), 1)
    order = tf.argsort(lengths, stable=True)
    size = (tf.size(order) + groups - 1) // groups
    width = tf.shape(encoder_tokens)[1]
    rows, outputs = [], []
    for g in range(groups):
        group = order[g * size:(g + 1) * size]
        # At least 1 wide (an empty group's maximum is the lowest int32),
        # at most the batch's width (0 for an empty batch).
        own = tf.minimum(tf.maximum(tf.reduce_max(tf.gather(lengths, group)), 1),
                         width)
        out = model.encode(tf.gather(encoder_tokens, group)[:, :own])
        rows.append(group)
        outputs.append(tf.pad(out, [[0, 0], [0, width - own], [0, 0]]))
    return tf.dynamic_stitch(rows, outputs)


def _decode_length(model, encoder_tokens, max_length):
    """``(steps, limits)``: the output width and each sentence's token limit
    (int32 ``(batch,)``). By default a sentence of n source tokens (END
    included, padding not) gets min(n + 50 (§6.1), model max_length - 1)
    and ``steps`` is that of the padded width; an int ``max_length`` is
    every sentence's limit."""
    if max_length is None:
        cap = model.max_length - 1
        own = tf.reduce_sum(tf.cast(tf.not_equal(encoder_tokens, PAD_ID),
                                    tf.int32), 1)
        return (tf.minimum(tf.shape(encoder_tokens)[1] + 50, cap),
                tf.minimum(own + 50, cap))
    if not 0 < int(max_length) < model.max_length:
        raise ValueError(
            f"`max_length` must be in [1, {model.max_length - 1}] for this "
            f"model (max_length {model.max_length} positions incl. START), "
            f"got max_length={max_length}"
        )
    return int(max_length), tf.fill([tf.shape(encoder_tokens)[0]], int(max_length))


class _Stepper:
    """Runs the decoder one position at a time, with or without a cache.

    By default the caches are head-major and grow by one position per step
    (``Transformer.decode_step``): writing, reading and
    reordering them costs the positions decoded so far. With
    ``static_cache`` they are head-major too, ``steps`` positions long from
    the start (``static_decode_step``, the same step writing at the
    position), so their shapes never change (what XLA needs). Both give the
    same logits.

    What the decoder reads of the source (the cross-attention caches, or the
    encoder outputs without a cache, and the padding mask) is the
    ``context``; the searches carry it through the loop with the decoder
    ``state`` (one row per hypothesis; the context of the caches one row
    per sentence, which the step shares among the sentence's hypotheses),
    so that rows of finished sentences can be dropped from both
    (``compact``): except with ``static_cache``, whose shapes must not
    change.
    """

    def __init__(self, model, encoder_outputs, encoder_mask, steps, use_cache,
                 static_cache=False, hypotheses=1):
        self.model = model
        self.use_cache = use_cache
        self.static_cache = static_cache
        self.compact = not (use_cache and static_cache)
        # With a cache the context keeps one row per sentence and the
        # decoder step groups the ``hypotheses`` rows of each sentence
        # (``Transformer.decode_step``); without, it has one row per
        # hypothesis, repeated here.
        self.context_per_sentence = use_cache
        if not self.context_per_sentence and hypotheses > 1:
            encoder_outputs = tf.repeat(encoder_outputs, hypotheses, axis=0)
            encoder_mask = tf.repeat(encoder_mask, hypotheses, axis=0)
        batch = tf.shape(encoder_outputs)[0]
        if self.context_per_sentence:
            batch = batch * hypotheses
        self.output_kernel = None
        if not use_cache:
            self.context = (encoder_outputs, encoder_mask)
            self.initial_state = []
            return
        self.context = (model.cross_attention_caches(encoder_outputs),
                        encoder_mask)
        self.output_kernel = model.output_kernel()
        if static_cache:
            self.initial_state = model.static_empty_self_attention_caches(
                batch, steps, encoder_outputs.dtype)
        else:
            self.initial_state = model.empty_self_attention_caches(
                batch, encoder_outputs.dtype)

    def shape_invariants(self):
        """For ``tf.while_loop``: (state, context)."""
        def rows_vary(c):
            return tf.TensorShape([None]).concatenate(c.shape[1:])

        context = tf.nest.map_structure(rows_vary, self.context)
        if self.static_cache:
            return tf.nest.map_structure(rows_vary, self.initial_state), context
        return ([(tf.TensorShape([None, k.shape[1], None, k.shape[3]]),) * 2
                 for k, _ in self.initial_state], context)

    def __call__(self, sequences, index, state, context):
        """sequences: (N, steps+1) ids; returns logits (N, V) at ``index``."""
        source, encoder_mask = context
        if self.use_cache:
            # Width 1 known when traced (a slice to ``index + 1`` would have
            # an unknown width, which XLA pads and gets wrong).
            tokens = tf.slice(sequences, [0, index], [-1, 1])
            if self.static_cache:
                return self.model.static_decode_step(
                    tokens, index, state, source, encoder_mask,
                    self.output_kernel)
            return self.model.decode_step(
                tokens, index, state, source, encoder_mask, self.output_kernel)
        prefix = sequences[:, : index + 1]
        logits = self.model.decode(prefix, source, encoder_mask)
        return logits[:, -1, :], state

    @staticmethod
    def reorder(structure, rows):
        return tf.nest.map_structure(lambda c: tf.gather(c, rows), structure)

    def drop_rows(self, context, rows, num_rows):
        """``context`` at ``rows``, gathered only when some were dropped."""
        return tf.cond(
            tf.size(rows) < num_rows,
            lambda: self.reorder(context, rows),
            lambda: context,
        )


def _scatter_rows(full, rows, part):
    """``full`` with its rows ``rows`` replaced by ``part`` (nested)."""
    return tf.nest.map_structure(
        lambda f, p: tf.tensor_scatter_nd_update(f, rows[:, None], p),
        full, part)


def greedy_search(model, encoder_tokens, max_length=None, use_cache=True,
                  static_cache=False, start_id=START_ID, end_id=END_ID,
                  encoder_outputs=None):
    """Greedy decoding: the arg-max token at every step.

    Rows whose sentence has ended are dropped from the decoder's batch
    (except with ``static_cache``), so a batch costs what its sentences
    need, not its longest sentence times its size.

    Args:
        model: a ``keras_trm.models.Transformer`` (or any object with its
            decoding methods: ``encode``, ``decode_step``, ...).
        encoder_tokens: int ``(batch, T_src)`` source ids (0 = padding).
        max_length: int, tokens to generate at most per sentence (default:
            the sentence's own source length, END included, + 50 (§6.1),
            capped by the model's max_length - 1). The output is as wide
            as the longest limit; a row stops at END or at its limit.
        use_cache: use the key/value cache (False: recompute the prefix).
        static_cache: use ``static_decode_step``'s fixed-size caches (static
            shapes, for ``tf.function(jit_compile=True)``); by default the
            caches grow by one position per step (faster in graph mode).
            The ids are the same either way.
        start_id, end_id: the tokenizer's ``[START]`` / ``[END]`` ids
            (``keras_trm.text``'s reserved ids by default); padding is 0.
        encoder_outputs: optional float ``(batch, T_src, d_model)``,
            ``model.encode(encoder_tokens)`` computed already (e.g. by
            ``encode_by_length``); by default the search encodes.

    Returns:
        int32 ``(batch, steps)`` generated ids (without START); after END
        every position is PAD (0).

    Raises:
        TypeError: non-integer ids. ValueError: bad shapes or max_length.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    ...                     max_length=12)
    >>> source = np.array([[5, 6, 3], [7, 3, 0]], "int32")   # ids + END, 0-padded
    >>> ids = greedy_search(model, source, max_length=6)
    >>> tuple(ids.shape), ids.dtype.name
    ((2, 6), 'int32')
    >>> bool(np.array_equal(ids, greedy_search(model, source, max_length=6,
    ...                                        use_cache=False)))
    True
    """
    encoder_tokens = _check_tokens(encoder_tokens)
    steps, limits = _decode_length(model, encoder_tokens, max_length)
    batch = tf.shape(encoder_tokens)[0]
    encoder_mask = tf.not_equal(encoder_tokens, PAD_ID)
    if encoder_outputs is None:
        encoder_outputs = model.encode(encoder_tokens)
    stepper = _Stepper(model, encoder_outputs, encoder_mask, steps + 1,
                       use_cache, static_cache)

    sequences = tf.concat(
        [tf.fill([batch, 1], start_id), tf.zeros([batch, steps], tf.int32)], 1
    )
    # Rows still decoded: their sentence, and whether it has ended.
    active = tf.range(batch)
    finished = tf.zeros([batch], tf.bool)

    def cond(i, sequences, active, finished, state, context):
        return tf.logical_and(i < steps, tf.logical_not(tf.reduce_all(finished)))

    def body(i, sequences, active, finished, state, context):
        logits, state = stepper(tf.gather(sequences, active), i, state, context)
        token = tf.argmax(logits, axis=-1, output_type=tf.int32)
        token = tf.where(finished, PAD_ID, token)
        sequences = tf.tensor_scatter_nd_update(
            sequences, tf.stack([active, tf.fill(tf.shape(active), i + 1)], 1),
            token,
        )
        # Ended, or at its sentence's token limit.
        finished = (finished | tf.equal(token, end_id)
                    | (i + 1 >= tf.gather(limits, active)))
        if stepper.compact:
            keep = tf.cast(tf.reshape(tf.where(~finished), [-1]), tf.int32)
            state, context = stepper.drop_rows(
                (state, context), keep, tf.size(active))
            active = tf.gather(active, keep)
            finished = tf.gather(finished, keep)
        return i + 1, sequences, active, finished, state, context

    state_shapes, context_shapes = stepper.shape_invariants()
    _, sequences, _, _, _, _ = tf.while_loop(
        cond, body,
        (tf.constant(0), sequences, active, finished, stepper.initial_state,
         stepper.context),
        shape_invariants=(tf.TensorShape([]), sequences.shape,
                          tf.TensorShape([None]), tf.TensorShape([None]),
                          state_shapes, context_shapes),
    )
    return sequences[:, 1:]


def top_k_rows(values, k):
    """``tf.math.top_k(values, k)`` for float ``(rows, V)`` with ``k`` much
    smaller than ``V``: the same values and indices in the same order (ties:
    the lower index first), several times faster on CPU.

    The row is cut into chunks of ``c`` ~ sqrt(V / k) entries (the last
    padded with -inf); the ``k`` chunks with the largest maxima (ties: the
    lower chunk) hold the row's ``k`` largest entries, since a chunk left
    out has ``k`` chunks before it, each with an entry that ranks before
    all of its own. Those chunks, taken in index order, are searched with
    ``tf.math.top_k``, so ties still go to the lower index.

    Args:
        values: float ``(rows, V)``, V static.
        k: int, 1 <= k <= V.

    Returns:
        ``(values (rows, k), indices int32 (rows, k))``, best first.

    Example:

    >>> x = tf.constant([[0., 3., 1., 3., 2., 5., 4., 0., 1.]])
    >>> v, i = top_k_rows(x, 3)
    >>> v.numpy().tolist(), i.numpy().tolist()
    ([[5.0, 4.0, 3.0]], [[5, 6, 1]])
    """
    width = int(values.shape[-1])
    chunk = max(8, int((width / k) ** 0.5))
    num_chunks = -(-width // chunk)
    if num_chunks <= k or width < 4 * k * chunk:
        return tf.math.top_k(values, k)
    rows = tf.shape(values)[0]
    pad = num_chunks * chunk - width
    if pad:
        values = tf.pad(values, [[0, 0], [0, pad]], constant_values=-float("inf"))
    chunks = tf.reshape(values, [rows, num_chunks, chunk])
    _, best = tf.math.top_k(tf.reduce_max(chunks, -1), k)
    best = tf.sort(best, axis=-1)  # index order: ties go to the lower index
    candidates = tf.reshape(tf.gather(chunks, best, batch_dims=1), [rows, k * chunk])
    top_values, at = tf.math.top_k(candidates, k)
    indices = tf.gather(best, at // chunk, batch_dims=1) * chunk + at % chunk
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


def _sort_by_rank_then_score(rank, score):
    """Indices ``(batch, n)`` ordering rank (bool) first, then score, both
    descending; ties keep their order (stable sorts, XLA-compilable)."""
    by_score = tf.argsort(score, axis=1, direction="DESCENDING", stable=True)
    rank = tf.cast(tf.gather(rank, by_score, batch_dims=1), tf.int32)
    by_rank = tf.argsort(rank, axis=1, direction="DESCENDING", stable=True)
    return tf.gather(by_score, by_rank, batch_dims=1)


def beam_search(
    model,
    encoder_tokens,
    beam_size=4,
    length_penalty_alpha=0.6,
    max_length=None,
    use_cache=True,
    return_all=False,
    early_stopping=True,
    static_cache=False,
    start_id=START_ID,
    end_id=END_ID,
    encoder_outputs=None,
):
    """Beam search with the GNMT length penalty and a beam kept full.

    Keeps ``beam_size`` = k live hypotheses per sentence at every step: of
    the 2k best extensions, those ending in END among the first k join a set
    of the k best finished ones (fairseq), the k best others stay live.
    A sentence stops once its best live log P / lp(limit) cannot beat
    its best finished score (tensor2tensor), or at its token limit,
    so with ``beam_size`` k the result is the exact best whenever the k-slot
    beam can reach it (tests compare with exhaustive search).
    ``beam_size=1`` is greedy search at every α: its one slot stops at the
    first END. A sentence that has stopped is frozen while others in the
    batch go on, so batched and one-by-one decoding agree.

    Args:
        model: as in ``greedy_search``.
        encoder_tokens: int ``(batch, T_src)``.
        beam_size: int >= 1 (4 in the paper).
        length_penalty_alpha: α >= 0 (0.6 in the paper; 0 = raw log-prob).
        max_length: as in ``greedy_search`` (a limit per sentence); a
            hypothesis that reaches its limit without END is finished with
            |Y| = the limit.
        use_cache: as in ``greedy_search``.
        return_all: also return the k best hypotheses and their normalized
            scores.
        early_stopping: when a sentence stops: True or ``"bound"``, as
            soon as no live hypothesis can beat its best finished one
            (exact); ``"first_end"``, also at the first step whose best
            candidate ends (CTranslate2's early exit: fewer steps, exact
            only for α = 0); False or ``"never"``, at its token limit
            (the best hypothesis is that of ``"bound"``).
        static_cache: as in ``greedy_search``.
        start_id, end_id, encoder_outputs: as in ``greedy_search``.

    Returns:
        int32 ``(batch, steps)`` best hypothesis per sentence (without
        START, PAD after END); with ``return_all`` the tuple
        ``(best, beams (batch, beam_size, steps), scores (batch, beam_size))``
        sorted best first: the finished hypotheses (END or max_length), then,
        if fewer than k finished, the best live ones at the stop, scored by
        their length so far. Slots no hypothesis reached score about -1e9.

    Raises:
        ValueError: beam_size < 1, α < 0, an unknown ``early_stopping``,
            bad shapes or max_length.

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> model = transformer(20, num_layers=1, d_model=16, num_heads=2, d_ff=32,
    ...                     max_length=12)
    >>> source = np.array([[5, 6, 3], [7, 3, 0]], "int32")
    >>> best, beams, scores = beam_search(model, source, beam_size=3,
    ...                                   max_length=6, return_all=True)
    >>> tuple(best.shape), tuple(beams.shape), tuple(scores.shape)
    ((2, 6), (2, 3, 6), (2, 3))
    >>> bool(np.all(scores[:, :-1] >= scores[:, 1:]))   # best first
    True
    >>> bool(np.array_equal(beam_search(model, source, beam_size=1, max_length=6),
    ...                     greedy_search(model, source, max_length=6)))
    True
    >>> # CTranslate2's stopping rule: fewer steps, exact only for alpha = 0
    >>> bool(np.array_equal(
    ...     beam_search(model, source, beam_size=3, length_penalty_alpha=0.0,
    ...                 max_length=6, early_stopping="first_end"),
    ...     beam_search(model, source, beam_size=3, length_penalty_alpha=0.0,
    ...                 max_length=6)))
    True
    """
    if int(beam_size) < 1:
        raise ValueError(f"`beam_size` must be >= 1, got beam_size={beam_size}")
    if float(length_penalty_alpha) < 0:
        raise ValueError(
            "`length_penalty_alpha` must be >= 0, got "
            f"length_penalty_alpha={length_penalty_alpha}"
        )
    rule = stop_rule(early_stopping)
    k = int(beam_size)
    alpha = float(length_penalty_alpha)
    encoder_tokens = _check_tokens(encoder_tokens)
    steps, limits = _decode_length(model, encoder_tokens, max_length)
    batch = tf.shape(encoder_tokens)[0]
    vocab = int(model.target_vocabulary_size)
    # 2k candidates: at most k of them (one per live hypothesis) end, so
    # at least k remain live.
    num_candidates = min(2 * k, k * vocab)
    per_row = min(num_candidates, vocab)

    # Encode once; each of the k live hypotheses has its own decoder row.
    encoder_mask = tf.not_equal(encoder_tokens, PAD_ID)
    if encoder_outputs is None:
        encoder_outputs = model.encode(encoder_tokens)
    stepper = _Stepper(model, encoder_outputs, encoder_mask, steps + 1,
                       use_cache, static_cache, hypotheses=k)

    alive_seq = tf.concat(
        [tf.fill([batch, k, 1], start_id), tf.zeros([batch, k, steps], tf.int32)],
        2,
    )
    # Per sentence: the search state. Only beam 0 is live at the start (all k
    # beams are the same prefix).
    search = dict(
        alive_seq=alive_seq,
        alive_logp=tf.tile(
            tf.constant([[0.0] + [NEG_INF] * (k - 1)], tf.float32), [batch, 1]),
        finished_seq=tf.zeros_like(alive_seq),
        finished_score=tf.fill([batch, k], NEG_INF),  # normalized scores
        finished_flag=tf.zeros([batch, k], tf.bool),
        done=tf.zeros([batch], tf.bool),
        alive_len=tf.zeros([batch], tf.int32),  # tokens of the live ones
    )
    search_shapes = dict(
        alive_seq=tf.TensorShape([None, k, None]),
        alive_logp=tf.TensorShape([None, k]),
        finished_seq=tf.TensorShape([None, k, None]),
        finished_score=tf.TensorShape([None, k]),
        finished_flag=tf.TensorShape([None, k]),
        done=tf.TensorShape([None]),
        alive_len=tf.TensorShape([None]),
    )
    # lp at each sentence's token limit: the bound's denominator.
    max_penalties = length_penalty(limits, alpha)
    beam_ids = tf.range(k)[None]

    def cond(i, active, search, results, state, context):
        return tf.logical_and(i < steps,
                              tf.logical_not(tf.reduce_all(search["done"])))

    def body(i, active, search, results, state, context, first=False):
        (alive_seq, alive_logp, finished_seq, finished_score, finished_flag,
         done, alive_len) = (search[key] for key in search_shapes)
        n = tf.shape(active)[0]  # sentences still searched
        if first:
            # Step 0: a sentence's k hypotheses are the same prefix (START)
            # over the same empty caches, so one row per sentence is
            # decoded and repeated k times: the logits and caches of k rows,
            # for 1/k of the work.
            logits, state = stepper(alive_seq[:, 0], i, state, context)
            logits = tf.repeat(logits, k, axis=0)
            state = tf.nest.map_structure(
                lambda c: tf.repeat(c, k, axis=0), state)
        else:
            flat = tf.reshape(alive_seq, [n * k, -1])
            logits, state = stepper(flat, i, state, context)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        # All candidates have i + 1 tokens: rank them by log-prob. The 2k
        # best of the k * V are among the 2k best of each hypothesis, so
        # rank those (top-k over k rows of V, then over k * 2k): the same
        # candidates in the same order as one top-k over the k * V (ties go
        # to the lower hypothesis, then the lower token, either way). Adding
        # a hypothesis' log P keeps the order of its row, so it is added to
        # the 2k picked per row only (the same sums as over the whole row).
        row_logp, row_token = top_k_rows(log_probs, per_row)
        row_logp = alive_logp[:, :, None] + tf.reshape(row_logp, [n, k, per_row])
        row_token = tf.reshape(row_token, [n, k, per_row])
        cand_logp, top = tf.math.top_k(
            tf.reshape(row_logp, [n, k * per_row]), num_candidates
        )
        cand_beam = top // per_row
        cand_token = tf.gather(
            tf.reshape(row_token, [n, k * per_row]), top, batch_dims=1
        )
        cand_seq = tf.gather(alive_seq, cand_beam, batch_dims=1)
        write = tf.equal(tf.range(tf.shape(alive_seq)[2]), i + 1)
        cand_seq = tf.where(write, cand_token[:, :, None], cand_seq)
        ended = tf.equal(cand_token, end_id)
        live = tf.logical_not(done)[:, None]
        # END counts only among the k best candidates (fairseq): an END
        # ranked below k live extensions is dropped, so beam 1 with α = 0
        # is greedy search.
        in_top_k = tf.range(num_candidates)[None] < k

        # The k best that have not ended stay live.
        _, keep = tf.math.top_k(
            tf.where(ended, -float("inf"), cand_logp), k
        )
        new_logp = tf.gather(cand_logp, keep, batch_dims=1)
        new_seq = tf.gather(cand_seq, keep, batch_dims=1)
        parent = tf.gather(cand_beam, keep, batch_dims=1)

        # Those that end join the k best finished (sentences not yet done).
        new_finished = ended & in_top_k & live & (cand_logp > NEG_INF / 2)
        end_score = tf.where(
            new_finished, cand_logp / length_penalty(i + 1, alpha), NEG_INF
        )
        pool_score = tf.concat([finished_score, end_score], 1)
        pool_flag = tf.concat([finished_flag, new_finished], 1)
        pool_seq = tf.concat([finished_seq, cand_seq], 1)
        finished_score, best = tf.math.top_k(pool_score, k)
        finished_flag = tf.gather(pool_flag, best, batch_dims=1)
        finished_seq = tf.gather(pool_seq, best, batch_dims=1)

        # Sentences already done keep their live hypotheses as they were
        # (only with ``static_cache``: otherwise they have been dropped).
        alive_seq = tf.where(live[:, :, None], new_seq, alive_seq)
        alive_logp = tf.where(live, new_logp, alive_logp)
        alive_len = tf.where(live[:, 0], i + 1, alive_len)
        parent = tf.where(live, parent, beam_ids)

        # A sentence whose hypotheses reached its token limit is done (the
        # live ones count as finished at the end).
        limit = tf.gather(limits, active)
        done = done | (i + 1 >= limit)
        if rule != "never":
            # Done when no live hypothesis can still beat the best finished
            # one: log P only falls and lp(|Y|) <= lp(its limit)
            # (tensor2tensor's bound, exact).
            bound = (tf.reduce_max(alive_logp, 1)
                     / tf.gather(max_penalties, active))
            done = done | (tf.reduce_max(finished_score, 1) >= bound)
        if rule == "first_end":
            # Or when the best candidate of this step ends (CTranslate2).
            done = done | new_finished[:, 0]
        if k == 1:
            # Beam 1 is greedy search: its one slot is done at the first END
            # (else, with α > 0, it would search on past greedy's END).
            done = done | finished_flag[:, 0]
        search = dict(alive_seq=alive_seq, alive_logp=alive_logp,
                      finished_seq=finished_seq, finished_score=finished_score,
                      finished_flag=finished_flag, done=done,
                      alive_len=alive_len)
        # Rows of the decoder: each live hypothesis continues its parent's.
        rows = parent + (tf.range(n) * k)[:, None]
        if stepper.compact:
            # Done sentences leave the batch: their state goes to
            # ``results``; the others' rows are kept (and reordered).
            results = _scatter_rows(results, active, search)
            kept = tf.cast(tf.reshape(tf.where(~done), [-1]), tf.int32)
            rows = tf.gather(rows, kept)
            if stepper.context_per_sentence:
                context = stepper.drop_rows(context, kept, n)
            else:
                context = stepper.drop_rows(
                    context, tf.reshape(kept[:, None] * k + beam_ids, [-1]),
                    n * k)
            search = stepper.reorder(search, kept)
            active = tf.gather(active, kept)
        state = stepper.reorder(state, tf.reshape(rows, [-1]))
        return i + 1, active, search, results, state, context

    state_shapes, context_shapes = stepper.shape_invariants()
    loop_vars = (tf.constant(0), tf.range(batch), search, search,
                 stepper.initial_state, stepper.context)
    if stepper.context_per_sentence and k > 1 and not static_cache:
        # Step 0 before the loop, one decoder row per sentence (``first``).
        # Not under XLA (``static_cache``): a second copy of the step costs
        # ~0.9 s of compiling per shape and saved nothing measurable.
        loop_vars = body(*loop_vars[:4], model.empty_self_attention_caches(
            batch, encoder_outputs.dtype), loop_vars[5], first=True)
    _, _, search, results, _, _ = tf.while_loop(
        cond,
        body,
        loop_vars,
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          search_shapes, search_shapes, state_shapes,
                          context_shapes),
    )
    if not stepper.compact:
        results = search
    (alive_seq, alive_logp, finished_seq, finished_score, finished_flag, _,
     alive_len) = (results[key] for key in search_shapes)
    # Live hypotheses that reached max_length are finished; others only fill
    # the slots the finished ones leave.
    alive_score = alive_logp / length_penalty(tf.maximum(alive_len, 1),
                                              alpha)[:, None]
    at_max = tf.equal(alive_len, limits)[:, None] & (alive_logp > NEG_INF / 2)
    pool_seq = tf.concat([finished_seq, alive_seq], 1)
    pool_score = tf.concat([finished_score, alive_score], 1)
    pool_rank = tf.concat([finished_flag, at_max], 1)
    order = _sort_by_rank_then_score(pool_rank, pool_score)[:, :k]
    beams = tf.gather(pool_seq, order, batch_dims=1)[:, :, 1:]
    best = beams[:, 0]
    if return_all:
        return best, beams, tf.gather(pool_score, order, batch_dims=1)
    return best
