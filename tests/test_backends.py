"""The core on every Keras backend: these tests use no TensorFlow and run
once per backend (``.ci/run``: ``KERAS_BACKEND=jax`` / ``torch`` beside the
TensorFlow suite), with test_blocks_and_models.py, test_initialization.py
and test_lstm_ln.py. The cross-backend tests start the other backends in
child processes (bounded in time)."""

import gzip
import itertools
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

from keras_trm.decoding import BeamSearch, GreedySearch
from keras_trm.models import transformer
from keras_trm.training import (LabelSmoothedCrossEntropy, NoamSchedule,
                                average_checkpoints, paper_adam)

END_ID, START_ID = 3, 2
BACKEND = keras.backend.backend()
ROOT = pathlib.Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.portable  # CI runs it under each backend


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def tiny_model():
    """7 ids with an untied output layer flat enough that the length penalty
    decides between outputs of different lengths; PAD and START never
    emitted."""
    keras.utils.set_random_seed(2)
    model = transformer(7, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=8, dropout_rate=0.0, tie_embeddings="none")
    projection = model.get_layer("output_projection")
    kernel, bias = projection.get_weights()
    kernel = np.random.default_rng(2).normal(0.0, 0.15, kernel.shape)
    bias[:] = 0.0
    bias[END_ID] = 0.5
    bias[[0, START_ID]] = -30.0
    projection.set_weights([kernel.astype("float32"), bias])
    return model


def _exhaustive(model, source, length, alpha):
    """Every output of at most ``length`` tokens scored from the full
    (uncached) decoder: ``(hyps (N, length), scores (N,))``."""
    vocab = model.target_vocabulary_size
    seqs = np.array(list(itertools.product(range(vocab), repeat=length)),
                    "int32")
    n = len(seqs)
    encoded = ops.repeat(model.encode(source[None]), n, axis=0)
    mask = np.repeat(source[None] != 0, n, axis=0)
    inputs = np.concatenate([np.full((n, 1), START_ID, "int32"), seqs[:, :-1]], 1)
    log_p = _log_softmax(to_numpy(model.decode(inputs, encoded, mask)).astype("float64"))
    cum = np.cumsum(np.take_along_axis(log_p, seqs[..., None], -1)[..., 0], 1)
    is_end = seqs == END_ID
    ends = np.where(is_end.any(1), is_end.argmax(1) + 1, length)
    hyps = np.where(np.arange(length)[None] < ends[:, None], seqs, 0)
    return hyps, cum[np.arange(n), ends - 1] / ((5 + ends) / 6) ** alpha


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_search_equals_exhaustive_search(tiny_model, alpha):
    """A beam that holds every prefix finds the best of all outputs."""
    length, vocab = 3, tiny_model.target_vocabulary_size
    source = np.array([[4, 5, 6, 3, 0], [6, 6, 4, 5, 3], [5, 3, 0, 0, 0]],
                      "int32")
    best, _, scores = BeamSearch(beam_size=vocab ** (length - 1),
                                 length_penalty=alpha, max_decoding_length=length)(tiny_model, source, return_all=True)
    best, scores = to_numpy(best), to_numpy(scores)
    for b in range(len(source)):
        hyps, exact = _exhaustive(tiny_model, source[b], length, alpha)
        top = int(np.argmax(exact))
        assert scores[b, 0] == pytest.approx(exact[top], abs=1e-4)
        runner_up = np.max(exact[(hyps != hyps[top]).any(1)])
        if exact[top] - runner_up > 1e-4:  # not a tie
            np.testing.assert_array_equal(best[b], hyps[top])


@pytest.fixture(scope="module")
def small_model():
    keras.utils.set_random_seed(5)
    model = transformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=24, dropout_rate=0.0)
    model.set_weights([w * 2.0 for w in model.get_weights()])  # fewer near-ties
    return model


@pytest.fixture
def source():
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 30, (5, 7)).astype("int32")
    ids[:, -1] = END_ID
    ids[1, 3:] = [END_ID, 0, 0, 0]
    ids[3, 1:] = [END_ID] + [0] * 5
    return ids


def test_cached_searches_equal_recompute_and_beam_one_is_greedy(small_model,
                                                                 source):
    """The cached step gives the ids of re-running the decoder over the
    whole prefix; beam 1 is greedy at any length penalty."""
    greedy = to_numpy(GreedySearch(max_decoding_length=9)(small_model, source))
    np.testing.assert_array_equal(
        greedy, to_numpy(GreedySearch(max_decoding_length=9)(small_model, source, use_cache=False)))
    for rule in (True, "first_end", False):
        cached = BeamSearch(beam_size=3, max_decoding_length=9,
                            early_stopping=rule)(small_model, source)
        np.testing.assert_array_equal(
            to_numpy(cached),
            to_numpy(BeamSearch(beam_size=3, max_decoding_length=9,
                                early_stopping=rule)(small_model, source,
                                                     use_cache=False)))
    np.testing.assert_array_equal(
        greedy, to_numpy(BeamSearch(beam_size=1, length_penalty=1.0,
                                    max_decoding_length=9)(small_model,
                                                           source)))


def test_a_sentence_decodes_alike_alone_and_in_a_batch(small_model, source):
    together = to_numpy(BeamSearch(beam_size=4)(small_model, source))
    for b in (1, 3):
        alone = to_numpy(BeamSearch(beam_size=4)(small_model, source[b:b + 1]))
        width = alone.shape[1]
        np.testing.assert_array_equal(alone[0], together[b, :width])
        assert not together[b, width:].any()


def test_search_follows_new_weights(small_model, source):
    """A compiled search (jax.jit) reads the model's current weights."""
    before = to_numpy(BeamSearch(beam_size=2)(small_model, source))
    weights = small_model.get_weights()
    try:
        small_model.set_weights([np.roll(w, 1, axis=-1) for w in weights])
        after = to_numpy(BeamSearch(beam_size=2)(small_model, source))
        assert not np.array_equal(before, after)
    finally:
        small_model.set_weights(weights)
    np.testing.assert_array_equal(
        before, to_numpy(BeamSearch(beam_size=2)(small_model, source)))


def test_searches_refuse_host_ids_outside_the_source_vocabulary(small_model, source):
    """An id past the embedding table read a row of NaN under JAX (and an
    index error elsewhere, or a negative id a row from the end): host ids
    given to the searches and to the model's encode / decode are checked
    against the vocabulary (30), naming the position."""
    for bad, value in ((30, 30), (-1, -1)):
        ids = source.copy()
        ids[2, 4] = bad
        for search in (GreedySearch(max_decoding_length=4),
                       BeamSearch(beam_size=2, max_decoding_length=4)):
            with pytest.raises(ValueError, match=rf"encoder_tokens\[2, 4\]={value} "):
                search(small_model, ids)
            with pytest.raises(ValueError, match=r"in \[0, 30\)"):
                search(small_model, ids.tolist())
    np.testing.assert_array_equal(  # in range: lists and arrays alike
        to_numpy(GreedySearch(max_decoding_length=4)(small_model, source.tolist())),
        to_numpy(GreedySearch(max_decoding_length=4)(small_model, source)))
    # The model's own encode / decode, called with host ids.
    bad = source.copy()
    bad[0, 1] = 31
    with pytest.raises(ValueError, match=r"source vocabulary\), got encoder_tokens\[0, 1\]=31 "):
        small_model.encode(bad)
    encoded = small_model.encode(source)
    with pytest.raises(ValueError, match=r"target vocabulary\), got decoder_tokens\[0, 1\]=31 "):
        small_model.decode(bad, encoded, source != 0)


def test_searches_stop_at_the_end_id_they_are_given():
    """The special ids are arguments (issue #41): a toy model that always
    emits id 5 stops at once with end_id=5, filling with the given pad_id,
    and runs to the limit with the default END (3)."""
    keras.utils.set_random_seed(0)
    model = transformer(8, num_layers=1, d_model=8, num_heads=2, d_ff=8,
                        max_sequence_length=12, tie_embeddings="none",
                        target_vocabulary_size=8)
    projection = model.get_layer("output_projection")
    kernel, bias = projection.get_weights()
    bias[:] = 0.0
    bias[5] = 30.0
    projection.set_weights([np.zeros_like(kernel), bias])
    source = np.array([[6, 7, 6, 7], [7, 6, 1, 1]], "int32")
    ids = dict(start_id=4, end_id=5, pad_id=1)
    for make in (GreedySearch, lambda **kw: BeamSearch(beam_size=2, **kw)):
        out = to_numpy(make()(model, source, **ids))
        assert out.shape == (2, 11)
        assert (out[:, 0] == 5).all() and (out[:, 1:] == 1).all()
        np.testing.assert_array_equal(
            to_numpy(make(max_decoding_length=6)(model, source)),
            np.full((2, 6), 5))


def _numpy_attention(q, k, v, mask):
    """Eq. (1) per head in numpy: q (B, T, h, d), k/v (B, S, h, d), bool
    mask (B, T, S); a fully masked row attends uniformly."""
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask[:, None], scores, -1e9)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", probs, v)


def _record_fused_calls(monkeypatch):
    """The keyword arguments of each ``ops.dot_product_attention`` call."""
    calls = []
    fused = ops.dot_product_attention
    monkeypatch.setattr(ops, "dot_product_attention",
                        lambda *a, **kw: calls.append(kw) or fused(*a, **kw))
    return calls


def _numpy_projections(mha, query, value):
    """``mha``'s q, k, v projections of numpy inputs, as numpy arrays."""
    return [to_numpy(mha._project(ops.convert_to_tensor(x), kernel, bias))
            for x, kernel, bias in (
                (query, mha.query_dense.kernel, mha.query_dense.bias),
                (value, mha.key_dense.kernel, mha.key_dense.bias),
                (value, mha.value_dense.kernel, mha.value_dense.bias))]


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_is_eq_1_with_masks(monkeypatch, causal):
    """Where it applies (JAX, PyTorch; no scores returned, no attention
    dropout in training), ``MultiHeadAttention`` attends through
    ``ops.dot_product_attention``; its output equals Eq. (1) in numpy and
    the einsum path's (which returns the scores), with padding and causal
    masks and a fully masked (padded) query row, on every backend."""
    from keras_trm.layers import MultiHeadAttention

    calls = _record_fused_calls(monkeypatch)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    mha = MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5, seed=1)
    mha.fused_min_key_length = 0  # JAX's default sends 5 keys to the einsums
    query_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    out = to_numpy(mha(x, x, query_mask=query_mask, value_mask=query_mask,
                       use_causal_mask=causal))  # not training: fused
    fused_calls = 0 if BACKEND == "tensorflow" else 1  # no fused kernel there
    assert len(calls) == fused_calls
    explicit, _ = mha(x, x, query_mask=query_mask, value_mask=query_mask,
                      use_causal_mask=causal, return_attention_scores=True)
    mha(x, x, training=True)  # attention dropout: the einsum path
    assert len(calls) == fused_calls
    np.testing.assert_allclose(out, to_numpy(explicit), atol=1e-6)

    q, k, v = _numpy_projections(mha, x, x)
    mask = query_mask[:, :, None] & query_mask[:, None, :]
    if causal:
        mask &= np.tril(np.ones((5, 5), bool))
    heads = _numpy_attention(q, k, v, mask)
    expected = heads.reshape(2, 5, 8) @ to_numpy(mha.output_dense.kernel).reshape(8, 8)
    expected += to_numpy(mha.output_dense.bias)
    assert np.isfinite(out).all()  # the padded rows of sentence 0 too
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_fused_attention_from_the_backends_key_length(monkeypatch):
    """By default JAX sends keys shorter than 512 to the einsums (faster
    than cuDNN there on an H200) and longer ones to the fused op; PyTorch
    uses its fused op (SDPA) at every length; TensorFlow never. Both paths
    give the same output at the threshold."""
    from keras_trm.layers import MultiHeadAttention
    from keras_trm.layers import multi_head_attention as module

    calls = _record_fused_calls(monkeypatch)
    monkeypatch.setitem(module.FUSED_MIN_KEY_LENGTH, "jax", 6)  # small shapes
    rng = np.random.default_rng(3)
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    short, long = (rng.normal(size=(2, n, 8)).astype("float32") for n in (5, 6))
    mha(short, short)
    expected_short = {"jax": 0, "torch": 1, "tensorflow": 0}[BACKEND]
    assert len(calls) == expected_short
    out = to_numpy(mha(long, long))
    expected_long = expected_short + (0 if BACKEND == "tensorflow" else 1)
    assert len(calls) == expected_long
    mha.fused_min_key_length = 10 ** 9  # an instance's setting wins: einsums
    np.testing.assert_allclose(to_numpy(mha(long, long)), out, atol=1e-6)
    assert len(calls) == expected_long


def test_label_smoothed_loss_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 6)).astype("float32")
    labels = np.array([[1, 5, 2, 0], [3, 0, 0, 0]])
    loss = float(to_numpy(LabelSmoothedCrossEntropy(label_smoothing=0.1)(
        labels, logits)))
    log_p = _log_softmax(logits.astype("float64"))
    per = (0.9 * -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
           + 0.1 * -log_p.mean(-1))
    mask = labels != 0
    assert loss == pytest.approx(per[mask].mean(), rel=1e-5)


def _value_and_gradient(fn, x):
    """``fn(x)`` and its gradient with respect to the tensor ``x``, through
    the backend's own autodiff."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(x)
            value = fn(x)
        return to_numpy(value), tape.gradient(value, x)
    if BACKEND == "jax":
        import jax

        value, grad = jax.value_and_grad(fn)(x)
        return to_numpy(value), grad
    x = x.detach().requires_grad_(True)
    value = fn(x)
    value.backward()
    return to_numpy(value.detach()), x.grad


def test_fused_projections_are_the_same_function(monkeypatch, small_model,
                                                source):
    """``MultiHeadAttention.fuse_projections`` (a lever for GPUs): query,
    key and value of one tensor go through one matmul. The layer's output
    and its gradients (input, a key kernel, the value bias), the model's
    logits and the searches' ids are those of one matmul per projection,
    and the fused path is really taken (``_project`` is not called for
    fused inputs). The rows compared include the padded decoder rows: the
    two paths must leave the same Keras masks on their inputs, which the
    next decoder layer reads."""
    import weakref

    from keras_trm.decoding import search as search_module
    from keras_trm.layers import MultiHeadAttention

    rng = np.random.default_rng(3)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=4)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    memory = rng.normal(size=(2, 3, 8)).astype("float32")
    mask = np.ones((2, 5, 5), bool)
    mask[1, :, 3:] = False
    layer(x, x)
    weight = ops.convert_to_tensor(rng.normal(size=(2, 5, 8)).astype("float32"))
    projected = []
    project = MultiHeadAttention._project
    monkeypatch.setattr(MultiHeadAttention, "_project", staticmethod(
        lambda *args: projected.append(1) or project(*args)))

    def results():
        out = {}
        for name, variable in (("key_kernel", layer.key_dense.kernel),
                               ("value_bias", layer.value_dense.bias)):
            def loss(t):
                with keras.StatelessScope(state_mapping=[(variable, t)]):
                    y = layer(x, x, attention_mask=mask)
                return ops.sum(y * weight)
            _, grad = _value_and_gradient(
                loss, ops.convert_to_tensor(to_numpy(variable)))
            out[name] = to_numpy(ops.convert_to_tensor(grad))
        xt = ops.convert_to_tensor(x)
        out["value"], grad = _value_and_gradient(
            lambda t: ops.sum(layer(t, t, attention_mask=mask) * weight), xt)
        out["input"] = to_numpy(ops.convert_to_tensor(grad))
        out["cross"] = to_numpy(layer(x, memory))
        out["logits"] = to_numpy(small_model(
            {"encoder_tokens": source, "decoder_tokens": source}))
        # JAX compiles a search once per model (search._COMPILED): without
        # a fresh cache both runs would reuse the one that earlier tests of
        # this module's model compiled, and neither would trace the
        # projections it is meant to check.
        monkeypatch.setattr(search_module, "_COMPILED",
                            weakref.WeakKeyDictionary())
        out["greedy"] = to_numpy(GreedySearch(max_decoding_length=9)(small_model, source))
        out["beam"] = to_numpy(BeamSearch(beam_size=3,
                                          max_decoding_length=9)(small_model, source))
        return out

    separate = results()
    calls_separate = len(projected)
    projected.clear()
    monkeypatch.setattr(MultiHeadAttention, "fuse_projections", True)
    fused = results()
    # ``_project`` runs in the cached step's projections (key_value_heads,
    # call_with_cache) and, fused, in ``call`` for an input projected alone
    # (unfused, ``call`` is Keras', through its EinsumDense sub-layers).
    # Separate: every cached projection. Fused: only the cross-attention
    # queries (the layer's cross call; each decoder layer's, in the model
    # and in the searches' cross-attention steps) are projected alone.
    assert 0 < len(projected) < calls_separate / 2
    for name, value in separate.items():
        if name in ("greedy", "beam"):
            np.testing.assert_array_equal(fused[name], value)
            continue
        # TensorFlow and PyTorch give the same floats on both paths. XLA's
        # CPU matmul rounds a product 3 x 16 columns wide differently from
        # one 16 wide (up to 2e-6 in one layer's projections), which this
        # model (two layers, weights doubled) amplifies to ~2e-4 in logits
        # up to 13: as far as its logits lie apart between the backends
        # (up to 1.4e-4). A different function (a mask, a bias) is off by
        # 0.1 or more (the masks of padded rows: 0.4 to 2.2).
        atol = 1e-3 if BACKEND == "jax" and name == "logits" else 1e-5
        np.testing.assert_allclose(fused[name], value, rtol=1e-5,
                                   atol=atol, err_msg=name)


def test_fused_attention_gets_the_mask_at_full_query_length(monkeypatch):
    """A key-only padding mask (cross-attention) reaches the fused op as
    (B, 1, T_q, T_k): cuDNN (JAX on a GPU) takes the mask as a bias of
    that shape and rejects (B, 1, 1, T_k), and Keras then fell back to
    XLA's attention. The output is still Eq. (1)."""
    if BACKEND == "tensorflow":
        pytest.skip("no fused attention under TensorFlow")
    from keras_trm.layers import MultiHeadAttention

    calls = _record_fused_calls(monkeypatch)
    rng = np.random.default_rng(2)
    query = rng.normal(size=(2, 3, 8)).astype("float32")
    value = rng.normal(size=(2, 5, 8)).astype("float32")
    value_mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    mha.fused_min_key_length = 0
    out = to_numpy(mha(query, value, value_mask=value_mask))
    assert len(calls) == 1 and tuple(calls[0]["mask"].shape) == (2, 1, 3, 5)
    q, k, v = _numpy_projections(mha, query, value)
    mask = np.broadcast_to(value_mask[:, None, :], (2, 3, 5))
    heads = _numpy_attention(q, k, v, mask)
    expected = heads.reshape(2, 3, 8) @ to_numpy(mha.output_dense.kernel).reshape(8, 8)
    np.testing.assert_allclose(out, expected + to_numpy(mha.output_dense.bias), atol=1e-5)


def test_embedding_gradient_sums_in_float32_under_mixed_bfloat16():
    """Under mixed_bfloat16 the lookup gathers float32 rows, so its
    gradient is a float32 scatter-add: 1,000 occurrences of one id, each
    with gradient 1, sum to 1,000. From the autocast (bf16) table the sum
    was bf16 under JAX and PyTorch and stopped at 256 (256 + 1 rounds back
    to 256): frequent ids lost most of their gradient."""
    from keras_trm.layers import PositionalEmbedding

    layer = PositionalEmbedding(vocabulary_size=4, d_model=2, max_sequence_length=1000,
                                scale_embeddings=False, dtype="mixed_bfloat16")
    ids = np.full((1, 1000), 3, "int32")
    layer.build(ids.shape)
    table = ops.convert_to_tensor(to_numpy(layer.embeddings))

    def total(t):  # as a model calls it: __call__, whose autocast scope counts
        with keras.StatelessScope(state_mapping=[(layer.embeddings, t)]):
            y = layer(ids)
        assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
        return ops.sum(ops.cast(y, "float32"))

    _, grad = _value_and_gradient(total, table)
    grad = to_numpy(ops.convert_to_tensor(grad))
    np.testing.assert_array_equal(grad, [[0, 0], [0, 0], [0, 0], [1000, 1000]])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_label_smoothed_loss_gradient_is_softmax_minus_targets(dtype):
    """The hand-written gradient against the analytic one in float64:
    (softmax(z) - q) m_t / sum m, with q the smoothed targets; zero on
    padding rows; in the logits' dtype."""
    rng = np.random.default_rng(1)
    vocab, eps = 9, 0.1
    logits = (3.0 * rng.normal(size=(2, 5, vocab))).astype("float32")
    labels = np.array([[1, 8, 2, 0, 0], [3, 4, 0, 0, 0]], "int32")
    z = ops.convert_to_tensor(logits, dtype=dtype)
    loss_fn = LabelSmoothedCrossEntropy(label_smoothing=eps)
    value, grad = _value_and_gradient(
        lambda x: loss_fn(ops.convert_to_tensor(labels), x), z)
    assert keras.backend.standardize_dtype(grad.dtype) == dtype
    z64 = to_numpy(ops.cast(z, "float32")).astype("float64")  # as rounded
    probs = np.exp(_log_softmax(z64))
    target = np.full_like(probs, eps / vocab)
    np.put_along_axis(target, labels[..., None], 1 - eps + eps / vocab, -1)
    mask = (labels != 0)[..., None]
    expected = (probs - target) * mask / mask.sum()
    per = -(target * _log_softmax(z64)).sum(-1)
    tol = 1e-6 if dtype == "float32" else 1e-2 * np.abs(expected).max()
    np.testing.assert_allclose(to_numpy(ops.cast(grad, "float32")), expected,
                               atol=tol)
    assert float(value) == pytest.approx(per[labels != 0].mean(), rel=1e-5)
    assert not to_numpy(ops.cast(grad, "float32"))[labels == 0].any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_label_smoothed_loss_gradient_is_the_one_hot_forms_to_the_bit(dtype):
    """The scatter at the labels gives the gradient the one-hot form gave,
    (softmax(z) - (1 - ε) one_hot(y) - ε / V) x upstream in float32 and then
    cast, bit for bit, on real and padding rows of (batch, T, V) logits; a
    label outside [0, V) gets no label term (its row stays softmax(z) - ε / V)
    while its loss is NaN."""
    rng = np.random.default_rng(3)
    vocab, eps = 37, 0.2
    logits = (4.0 * rng.normal(size=(3, 7, vocab))).astype("float32")
    labels = rng.integers(1, vocab, (3, 7)).astype("int32")
    labels[0, 5:] = 0
    labels[2, 3] = vocab  # outside [0, V)
    z = ops.convert_to_tensor(logits, dtype=dtype)
    y = ops.convert_to_tensor(labels)
    upstream = ops.convert_to_tensor(rng.uniform(0.5, 2.0, (3, 7)).astype("float32"))

    def one_hot_form(x):
        lse = ops.logsumexp(ops.cast(x, "float32"), axis=-1)
        probs = ops.exp(ops.cast(x, "float32") - ops.expand_dims(lse, -1))
        in_range = ops.where(ops.less(y, vocab), y, -1)  # one_hot(-1) is zeros
        target = ops.one_hot(in_range, vocab, dtype="float32") * (1.0 - eps)
        return ops.cast((probs - target - eps / vocab) * ops.expand_dims(upstream, -1),
                        x.dtype)

    from keras_trm.training.losses import _smoothed_cross_entropy

    value, grad = _value_and_gradient(
        lambda x: ops.sum(_smoothed_cross_entropy(y, x, eps) * upstream), z)
    assert np.isnan(value)  # the label outside [0, V)
    np.testing.assert_array_equal(to_numpy(ops.cast(grad, "float32")),
                                  to_numpy(ops.cast(one_hot_form(z), "float32")))
    per_token = to_numpy(_smoothed_cross_entropy(y, z, eps))
    assert np.isnan(per_token[2, 3]) and np.isfinite(np.delete(per_token.ravel(), 17)).all()


def test_label_smoothed_loss_rejects_labels_outside_the_vocabulary():
    logits = np.zeros((1, 3, 5), "float32")
    loss_fn = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    for bad in (5, -100):
        labels = np.array([[1, bad, 0]], "int32")
        with pytest.raises(ValueError, match=rf"`y_true` holds label {bad}.*V=5"):
            loss_fn(labels, logits)
        # A tensor is not read back: the loss is NaN, not a wrong number.
        value = to_numpy(loss_fn(ops.convert_to_tensor(labels), logits))
        assert np.isnan(value)


def test_noam_schedule_is_the_papers_formula():
    schedule = NoamSchedule(d_model=512, warmup_steps=4000)
    for step in (0, 3999, 4000, 100000):
        n = step + 1  # Keras counts from 0, the paper from 1
        expected = 512 ** -0.5 * min(n ** -0.5, n * 4000 ** -1.5)
        assert float(to_numpy(schedule(step))) == pytest.approx(expected,
                                                                rel=1e-5)


def test_weight_decay_shrinks_matrices_and_embeddings_only():
    """paper_adam(weight_decay=) is decoupled (AdamW): with zero gradients
    Adam's own step is 0, so weight decay alone moves each matrix and
    embedding to (1 - lr * weight_decay) of itself; biases and LayerNorm's
    gamma and beta stay. A reloaded optimizer spares the same ones."""
    from keras_trm.training import FusedAdam

    keras.utils.set_random_seed(3)
    model = transformer(30, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=8)
    lr, weight_decay = 0.01, 0.5
    optimizer = paper_adam(lr, weight_decay=weight_decay)
    variables = model.trainable_variables
    before = [to_numpy(w) for w in variables]
    optimizer.apply_gradients([(ops.zeros(w.shape, w.dtype), w) for w in variables])
    decayed, spared = set(), set()
    for w, w0 in zip(variables, before):
        keep = any(part in w.name for part in ("bias", "gamma", "beta"))
        (spared if keep else decayed).add(w.name.rsplit("_", 1)[-1])
        np.testing.assert_allclose(to_numpy(w), w0 if keep else w0 * (1 - lr * weight_decay),
                                   rtol=1e-6, err_msg=w.path)
    assert {"kernel", "embeddings"} <= decayed and {"bias", "gamma", "beta"} <= spared
    again = FusedAdam.from_config(optimizer.get_config())
    assert again.weight_decay == weight_decay
    assert again.weight_decay_exclude_names == ("bias", "gamma", "beta")
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"weight_decay={bad}"):
            paper_adam(lr, weight_decay=bad)


def _char_pairs(data_dir, n=256, width=24):
    """The first n Multi30k training pairs as character ids (a real corpus
    without a tokenizer: 4 + the characters seen)."""
    folder = pathlib.Path(data_dir) / "multi30k"
    with gzip.open(folder / "train.en.gz", "rt", encoding="utf-8") as en, \
            gzip.open(folder / "train.de.gz", "rt", encoding="utf-8") as de:
        pairs = [(e.strip()[:width - 2], d.strip()[:width - 2])
                 for e, d in itertools.islice(zip(en, de), n)]
    chars = sorted({c for pair in pairs for text in pair for c in text})
    index = {c: i + 4 for i, c in enumerate(chars)}

    def ids(text, prefix):
        row = prefix + [index[c] for c in text] + [END_ID]
        return row + [0] * (width - len(row))

    source = np.array([ids(e, []) for e, _ in pairs], "int32")
    target = np.array([ids(d, [START_ID]) for _, d in pairs], "int32")
    return source, target, len(chars) + 4


def test_training_loss_falls_on_real_data(data_dir):
    """The paper's recipe (Noam, Adam(0.9, 0.98, 1e-9), label smoothing) on
    256 real Multi30k pairs: the loss falls."""
    source, target, vocab = _char_pairs(data_dir)
    keras.utils.set_random_seed(0)
    model = transformer(vocab, num_layers=1, d_model=32, num_heads=2, d_ff=64,
                        max_sequence_length=32)
    model.compile(optimizer=paper_adam(NoamSchedule(d_model=32,
                                                    warmup_steps=30)),
                  loss=LabelSmoothedCrossEntropy(label_smoothing=0.1))
    history = model.fit({"encoder_tokens": source,
                         "decoder_tokens": target[:, :-1]},
                        target[:, 1:], batch_size=32, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0], losses


def test_average_checkpoints_is_the_mean(tmp_path, small_model):
    weights = small_model.get_weights()
    try:
        paths = []
        for i, scale in enumerate((1.0, 3.0)):
            small_model.set_weights([w * scale for w in weights])
            paths.append(tmp_path / f"{i}.weights.h5")
            small_model.save_weights(paths[-1])
        average_checkpoints(small_model, paths)
        for got, w in zip(small_model.get_weights(), weights):
            np.testing.assert_allclose(got, 2.0 * w, rtol=1e-6)
    finally:
        small_model.set_weights(weights)


# -- across backends (child processes) -------------------------------------

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, keras
    from keras_trm.decoding import BeamSearch, GreedySearch, Translator
    from keras_trm.models import transformer
    from keras_trm.text import RESERVED_TOKENS, TextTokenizer

    def run(mode, path, out):
        keras.utils.set_random_seed(int(mode == "save"))
        model = transformer(40, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                            max_sequence_length=40, tie_embeddings="none")
        if mode == "save":
            model.save_weights(path)
        else:
            model.load_weights(path)
        rng = np.random.default_rng(0)
        src = rng.integers(4, 40, (4, 9)).astype("int32")
        src[:, -1] = 3
        src[1, 4:] = [3, 0, 0, 0, 0]
        tgt = rng.integers(4, 40, (4, 6)).astype("int32")
        logits = model({"encoder_tokens": src, "decoder_tokens": tgt})
        result = dict(
            backend=keras.backend.backend(),
            logits=keras.ops.convert_to_numpy(logits).tolist(),
            greedy=np.asarray(GreedySearch()(model, src)).tolist(),
            beam=np.asarray(BeamSearch(beam_size=4)(model, src)).tolist())
        # Raw text through TensorFlow's tokenizer and this backend's search
        # (greedy, one batch: the beam ids are compared above, and each
        # search or batch shape more costs a compilation per process).
        words = list(RESERVED_TOKENS) + [
            f"w{i}" for i in range(40 - len(RESERVED_TOKENS))]
        sentences = ["w1 w2 w3 .", "  ", "w7 " * 30, "w5"]
        result["texts"] = Translator(model, TextTokenizer(words),
                                     search=GreedySearch()
                                     ).translate_texts(sentences, batch_size=4)
        json.dump(result, open(out, "w"))

    for task in sys.argv[1:]:  # "mode,weights,out", in order
        run(*task.split(","))
""")


def _child(backend, *tasks):
    """Runs ``(mode, weights, out)`` tasks in order in one process of
    ``backend``; returns their results."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    subprocess.run([sys.executable, "-c", _CHILD,
                    *(",".join(map(str, task)) for task in tasks)],
                   env=env, cwd=ROOT, check=True, timeout=300,
                   capture_output=True)
    return [json.loads(pathlib.Path(out).read_text()) for _, _, out in tasks]


@pytest.mark.skipif(BACKEND != "tensorflow",
                    reason="run once, from the TensorFlow suite")
@pytest.mark.slow
def test_weights_round_trip_across_backends(tmp_path):
    """``.weights.h5`` written under each backend load under the other two
    with the same logits (float32, <= 1e-5), the same greedy and beam ids
    and the same ``Translator.translate_texts`` output (raw text in)."""
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    # Five processes, not nine (one per save and per load): each backend
    # loads what the earlier ones wrote, then writes its own.
    weights = {b: tmp_path / f"{b}.weights.h5" for b in ("tensorflow", "jax", "torch")}
    plan = [("tensorflow", [], "tensorflow"), ("jax", ["tensorflow"], "jax"),
            ("torch", ["tensorflow", "jax"], "torch"),
            ("tensorflow", ["jax", "torch"], None), ("jax", ["torch"], None)]
    saved, loaded = {}, {}
    for reader, writers, saves in plan:
        tasks = [("load", weights[w], tmp_path / f"{w}_{reader}.json")
                 for w in writers]
        if saves:
            tasks.append(("save", weights[saves], tmp_path / f"{saves}.json"))
        results = _child(reader, *tasks)
        if saves:
            saved[saves] = results.pop()
        loaded.update({(w, reader): r for w, r in zip(writers, results)})
    assert len(loaded) == 6
    for (writer, reader), result in loaded.items():
        assert result["backend"] == reader == saved[reader]["backend"]
        np.testing.assert_allclose(result["logits"], saved[writer]["logits"],
                                   atol=1e-5)
        assert result["greedy"] == saved[writer]["greedy"], (writer, reader)
        assert result["beam"] == saved[writer]["beam"], (writer, reader)
        assert result["texts"] == saved[writer]["texts"], (writer, reader)


_DATA_PARALLEL = textwrap.dedent("""
    import json, sys
    import numpy as np, keras, jax
    from keras_trm.models import transformer
    from keras_trm.training import LabelSmoothedCrossEntropy
    devices = jax.devices()
    assert len(devices) == 2, devices
    if sys.argv[1] == "2":
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices))
    keras.utils.set_random_seed(0)
    model = transformer(30, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=16, dropout_rate=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=LabelSmoothedCrossEntropy(label_smoothing=0.1))
    rng = np.random.default_rng(0)
    src = rng.integers(4, 30, (8, 7)).astype("int32")
    tgt = rng.integers(4, 30, (8, 6)).astype("int32")
    tgt[:4, 2:] = 0   # device 0 gets 4 real target tokens, device 1 gets 20
    history = model.fit({"encoder_tokens": src, "decoder_tokens": tgt[:, :-1]},
                        tgt[:, 1:], batch_size=8, epochs=3, shuffle=False,
                        verbose=0)
    json.dump(dict(loss=history.history["loss"],
                   weights=[float(np.sum(w)) for w in model.get_weights()]),
              open(sys.argv[2], "w"))
""")


_SHARDED_LOSS = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from keras_trm.training import LabelSmoothedCrossEntropy
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    batch = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)),
                          PartitionSpec("batch"))
    rng = np.random.default_rng(0)
    logits = jax.device_put(jnp.asarray(rng.normal(size=(8, 16, 997)), "float32"), batch)
    labels = jax.device_put(jnp.asarray(rng.integers(0, 997, (8, 16)), "int32"), batch)
    step = jax.jit(jax.value_and_grad(lambda z: loss(labels, z)))
    hlo = step.lower(logits).compile().as_text()
    ops = ("all-gather", "all-reduce", "all-to-all", "collective-permute",
           "reduce-scatter")
    collectives = [line.strip() for line in hlo.splitlines()
                   if any(f" {op}(" in line or f" {op}-start(" in line for op in ops)]
    value, grad = step(logits)
    json.dump(dict(collectives=collectives,
                   grad_spec=list(grad.sharding.spec)), open(sys.argv[1], "w"))
""")


@pytest.mark.skipif(BACKEND != "jax", reason="run once, from the JAX suite")
def test_jax_data_parallel_loss_gradient_stays_on_its_device(tmp_path):
    """Under a batch-sharded jit (what ``DataParallel`` compiles) the loss's
    hand-written gradient, a scatter into (batch, T, V), is built where its
    rows live: no collective moves anything of the vocabulary's size
    (997 here); only the scalar sums and the B x T label positions and
    values cross devices."""
    pytest.importorskip("jax")
    out = tmp_path / "hlo.json"
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    subprocess.run([sys.executable, "-c", _SHARDED_LOSS, str(out)], env=env,
                   cwd=ROOT, check=True, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    assert result["grad_spec"][0] == "batch"   # the gradient stays batch-sharded
    assert result["collectives"], "expected the loss's scalar all-reduce"
    for line in result["collectives"]:
        assert "997" not in line.split("=", 1)[1].split("(", 1)[0], line


@pytest.mark.skipif(BACKEND != "jax", reason="run once, from the JAX suite")
def test_jax_data_parallel_equals_one_device(tmp_path):
    """``keras.distribution.DataParallel`` over 2 (forced host) devices
    trains to the losses and weights of one device, also when the devices'
    halves of the batch hold very different numbers of real tokens (the
    loss is the mean over the global batch's tokens)."""
    pytest.importorskip("jax")
    results = []
    for replicas in ("1", "2"):
        out = tmp_path / f"{replicas}.json"
        env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
                   XLA_FLAGS="--xla_force_host_platform_device_count=2")
        subprocess.run([sys.executable, "-c", _DATA_PARALLEL, replicas, str(out)],
                       env=env, cwd=ROOT, check=True, timeout=300,
                       capture_output=True)
        results.append(json.loads(out.read_text()))
    one, two = results
    assert one["loss"][-1] < one["loss"][0]
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(two["weights"], one["weights"], rtol=1e-4,
                               atol=1e-4)
