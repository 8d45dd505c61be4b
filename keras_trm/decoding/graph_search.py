"""TensorFlow's graph-only optimisation of ``keras_trm.decoding.search``.

The same searches (the strategy's per-step ``update``, of
``GreedySearch`` or ``BeamSearch``), driven by a ``tf.while_loop`` whose
loop variables may change shape:

- the head-major self-attention caches grow by one position per step
  (``decode_step(..., grow=True)``): writing, reading and reordering them costs
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


def _shape_invariants(stepper):
    """For ``tf.while_loop``: (state, context) with rows (and the caches'
    positions) that vary."""
    context = tf.nest.map_structure(
        lambda c: tf.TensorShape([None]).concatenate(c.shape[1:]),
        stepper.context)
    return ([(tf.TensorShape([None, k.shape[1], None, k.shape[3]]),) * 2
             for k, _ in stepper.initial_state], context)


def _reorder(structure, rows):
    return tf.nest.map_structure(lambda c: tf.gather(c, rows), structure)


def _drop_rows(context, rows, num_rows):
    """``context`` at ``rows``, gathered only when some were dropped."""
    return tf.cond(tf.size(rows) < num_rows,
                   lambda: _reorder(context, rows), lambda: context)


def _scatter_rows(full, rows, part):
    """``full`` with its rows ``rows`` replaced by ``part`` (nested)."""
    return tf.nest.map_structure(
        lambda f, p: tf.tensor_scatter_nd_update(f, rows[:, None], p),
        full, part)


def greedy(search, model, encoder_tokens, encoder_outputs, steps, limits,
           ids, use_cache, return_all=False):
    """``GreedySearch`` ``search`` with finished rows leaving the batch, on
    its checked inputs: output width ``steps``, token limits ``limits``
    ``(batch,)``, ``ids`` = (start, end, pad)."""
    start_id, end_id, pad_id = ids
    batch = tf.shape(encoder_tokens)[0]
    encoder_mask = tf.not_equal(encoder_tokens, pad_id)
    stepper = search.stepper(model, encoder_outputs, encoder_mask, use_cache)
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
        state, context = _drop_rows((state, context), keep, tf.size(active))
        active = tf.gather(active, keep)
        finished = tf.gather(finished, keep)
        return i + 1, sequences, active, finished, state, context

    state_shapes, context_shapes = _shape_invariants(stepper)
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
    stepper = beam.stepper(model, encoder_outputs, encoder_mask, use_cache)
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
        if use_cache:  # one context row per sentence
            context = _drop_rows(context, kept, n)
        else:
            context = _drop_rows(
                context, tf.reshape(kept[:, None] * k + beam_ids, [-1]),
                n * k)
        search = _reorder(search, kept)
        active = tf.gather(active, kept)
        state = _reorder(state, tf.reshape(rows, [-1]))
        return i + 1, active, search, results, state, context

    state_shapes, context_shapes = _shape_invariants(stepper)
    loop_vars = (tf.constant(0), tf.range(batch), search, search,
                 stepper.initial_state, stepper.context)
    if use_cache and k > 1:
        # Step 0 before the loop, one decoder row per sentence (``first``).
        loop_vars = body(*loop_vars[:4], model.empty_caches(
            batch, 0, encoder_outputs.dtype), loop_vars[5], first=True)
    _, _, _, results, _, _ = tf.while_loop(
        cond,
        body,
        loop_vars,
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]),
                          search_shapes, search_shapes, state_shapes,
                          context_shapes),
    )
    return beam.result(results, limits, return_all)
