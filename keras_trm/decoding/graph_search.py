"""TensorFlow's graph-only optimisation of ``keras_trm.decoding.search``.

The same searches (the strategy's per-step ``update``, of
``GreedySearch`` or ``BeamSearch``), driven by a ``tf.while_loop`` whose
loop variables may change shape:

- the head-major self-attention caches grow by one position per step
  (``Transformer.decode_step``): writing, reading and reordering them costs
  the positions decoded so far, not the whole output width;
- the rows of finished sentences leave the decoder's batch (their search
  state is kept aside), so a batch costs what its sentences need, not its
  longest sentence times its size;
- beam search decodes step 0, where a sentence's k hypotheses are all
  START, as one row per sentence.

The ids are those of the fixed-size loop (tested). Only TensorFlow builds
such loops (``tf.while_loop`` shape invariants); JAX and XLA need the
fixed-size loop. Imported by the searches on the TensorFlow backend only.
"""

import tensorflow as tf


def encode_in_groups(model, encoder_tokens, groups, pad_id):
    """``encode_by_length``'s grouped encoding (see there); ``pad_id``: the
    padding id, which a sentence's length does not count."""
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(encoder_tokens, pad_id),
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


class _Stepper:
    """Runs the decoder one position at a time, with or without a cache.

    With a cache the caches are head-major and grow by one position per
    step (``Transformer.decode_step``). What the decoder reads of the
    source (the cross-attention caches, or the encoder outputs without a
    cache, and the padding mask) is the ``context``; the searches carry it
    through the loop with the decoder ``state`` (one row per hypothesis;
    the context of the caches one row per sentence, which the step shares
    among the sentence's hypotheses), so that rows of finished sentences
    can be dropped from both.
    """

    def __init__(self, model, encoder_outputs, encoder_mask, use_cache,
                 hypotheses=1):
        self.model = model
        self.use_cache = use_cache
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
        self.initial_state = model.empty_self_attention_caches(
            batch, encoder_outputs.dtype)

    def shape_invariants(self):
        """For ``tf.while_loop``: (state, context)."""
        def rows_vary(c):
            return tf.TensorShape([None]).concatenate(c.shape[1:])

        context = tf.nest.map_structure(rows_vary, self.context)
        return ([(tf.TensorShape([None, k.shape[1], None, k.shape[3]]),) * 2
                 for k, _ in self.initial_state], context)

    def __call__(self, sequences, index, state, context):
        """sequences: (N, steps+1) ids; returns logits (N, V) at ``index``."""
        source, encoder_mask = context
        if self.use_cache:
            tokens = tf.slice(sequences, [0, index], [-1, 1])
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


def greedy(search, model, encoder_tokens, encoder_outputs, steps, limits,
           ids, use_cache):
    """``GreedySearch`` ``search`` with finished rows leaving the batch, on
    its checked inputs: output width ``steps``, token limits ``limits``
    ``(batch,)``, ``ids`` = (start, end, pad)."""
    start_id, end_id, pad_id = ids
    batch = tf.shape(encoder_tokens)[0]
    encoder_mask = tf.not_equal(encoder_tokens, pad_id)
    stepper = _Stepper(model, encoder_outputs, encoder_mask, use_cache)
    sequences = tf.concat(
        [tf.fill([batch, 1], start_id), tf.fill([batch, steps], pad_id)], 1
    )
    # Rows still decoded: their sentence, and whether it has ended.
    active = tf.range(batch)
    finished = tf.zeros([batch], tf.bool)

    def cond(i, sequences, active, finished, state, context):
        return tf.logical_and(i < steps, tf.logical_not(tf.reduce_all(finished)))

    def body(i, sequences, active, finished, state, context):
        logits, state = stepper(tf.gather(sequences, active), i, state, context)
        token, finished = search.update(logits, finished, i,
                                        tf.gather(limits, active), end_id,
                                        pad_id)
        sequences = tf.tensor_scatter_nd_update(
            sequences, tf.stack([active, tf.fill(tf.shape(active), i + 1)], 1),
            token,
        )
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


def beam(beam, model, encoder_tokens, encoder_outputs, steps, limits, ids,
         use_cache, return_all):
    """``BeamSearch`` ``beam`` with finished sentences leaving the batch
    (the same ``initial_state``, ``update``, ``penalty`` and ``result`` as
    the fixed-size loop), as ``greedy``."""
    start_id, end_id, pad_id = ids
    k = beam.beam_size
    batch = tf.shape(encoder_tokens)[0]
    vocab = int(model.target_vocabulary_size)
    encoder_mask = tf.not_equal(encoder_tokens, pad_id)
    stepper = _Stepper(model, encoder_outputs, encoder_mask, use_cache,
                       hypotheses=k)
    search = beam.initial_state(batch, steps, start_id, pad_id)
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
    max_penalties = beam.penalty(limits)
    beam_ids = tf.range(k)[None]

    def cond(i, active, search, results, state, context):
        return tf.logical_and(i < steps,
                              tf.logical_not(tf.reduce_all(search["done"])))

    def body(i, active, search, results, state, context, first=False):
        n = tf.shape(active)[0]  # sentences still searched
        if first:
            # Step 0: a sentence's k hypotheses are the same prefix (START)
            # over the same empty caches, so one row per sentence is
            # decoded and repeated k times: the logits and caches of k rows,
            # for 1/k of the work.
            logits, state = stepper(search["alive_seq"][:, 0], i, state,
                                    context)
            logits = tf.repeat(logits, k, axis=0)
            state = tf.nest.map_structure(
                lambda c: tf.repeat(c, k, axis=0), state)
        else:
            flat = tf.reshape(search["alive_seq"], [n * k, -1])
            logits, state = stepper(flat, i, state, context)
        search, parent = beam.update(
            search, logits, i, tf.gather(limits, active),
            tf.gather(max_penalties, active), end_id, pad_id, vocab)
        # Rows of the decoder: each live hypothesis continues its parent's.
        rows = parent + (tf.range(n) * k)[:, None]
        # Done sentences leave the batch: their state goes to
        # ``results``; the others' rows are kept (and reordered).
        results = _scatter_rows(results, active, search)
        kept = tf.cast(tf.reshape(tf.where(~search["done"]), [-1]), tf.int32)
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
    if stepper.context_per_sentence and k > 1:
        # Step 0 before the loop, one decoder row per sentence (``first``).
        loop_vars = body(*loop_vars[:4], model.empty_self_attention_caches(
            batch, encoder_outputs.dtype), loop_vars[5], first=True)
    _, _, _, results, _, _ = tf.while_loop(
        cond,
        body,
        loop_vars,
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          search_shapes, search_shapes, state_shapes,
                          context_shapes),
    )
    return beam.result(results, limits, return_all)
