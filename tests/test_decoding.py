"""Greedy and beam search over the key/value cache; sacreBLEU."""

import itertools

import keras
import numpy as np
import pytest

from conftest import assert_allclose, assert_array_equal, random_ids, to_np
from keras_trm.decoding import (BeamSearch, GreedySearch, corpus_bleu, length_penalty,
                                search_strategy)
from keras_trm.decoding.search import encode_by_length, top_k_rows
from keras_trm.models import transformer
from keras_trm.text import END_ID, PAD_ID, START_ID

pytestmark = pytest.mark.portable  # CI runs it under each backend


# _Recorder reads the decoder's inputs in Python, step by step; JAX traces
# the search loop, so there is nothing to read.
records_steps = pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="records each step's inputs in Python; JAX traces the loop")


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    model = transformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=24, dropout_rate=0.0)
    # Make END reasonably likely so that hypotheses end at different steps.
    emb = model.get_layer("embedding")
    table = to_np(emb.embeddings)
    table[END_ID] *= 3.0
    emb.embeddings.assign(table)
    return model


@pytest.fixture
def source(rng):
    return random_ids(rng, (4, 6), 30, pad_from=[6, 4, 5, 2])


def sequence_log_prob(model, source, hyp):
    """log P(hyp | source) with a full (uncached) forward pass."""
    if (hyp == END_ID).any():
        n = int(np.argmax(hyp == END_ID)) + 1
    else:  # still alive when the search stopped: its tokens up to padding
        n = int(np.argmax(hyp == 0)) if (hyp == 0).any() else len(hyp)
    dec_in = np.concatenate([[START_ID], hyp[: n - 1]])[None].astype("int32")
    logits = to_np(model({"encoder_tokens": source[None],
                          "decoder_tokens": dec_in})[0])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(sum(log_p[t, hyp[t]] for t in range(n))), n


def test_cached_greedy_equals_recompute(model, source):
    cached = to_np(GreedySearch(max_decoding_length=12)(model, source))
    full = to_np(GreedySearch(max_decoding_length=12)(model, source, use_cache=False))
    assert_array_equal(cached, full)
    # After END only padding.
    for row in cached:
        if (row == END_ID).any():
            assert not row[int(np.argmax(row == END_ID)) + 1:].any()


def test_greedy_is_the_argmax_path(model, source):
    out = to_np(GreedySearch(max_decoding_length=6)(model, source))
    prefix = np.full((len(source), 1), START_ID, "int32")
    for t in range(6):
        logits = model({"encoder_tokens": source, "decoder_tokens": prefix})
        nxt = np.argmax(to_np(logits[:, -1]), -1).astype("int32")
        done = (prefix[:, 1:] == END_ID).any(1) if t else np.zeros(len(source), bool)
        assert_array_equal(out[~done, t], nxt[~done])
        prefix = np.concatenate([prefix, out[:, t:t + 1]], 1)


def normalized_score(model, source, hyp, alpha):
    log_p, n = sequence_log_prob(model, source, hyp)
    return log_p / ((5 + n) / 6) ** alpha


def test_beam_one_equals_greedy(model, source):
    greedy = to_np(GreedySearch(max_decoding_length=12)(model, source))
    for alpha in (0.0, 0.6, 1.0):
        beam = to_np(BeamSearch(beam_size=1, length_penalty=alpha,
                          max_decoding_length=12)(model, source))
        assert_array_equal(beam, greedy)


def test_beam_scores_are_model_log_probs_with_length_penalty(model, source):
    alpha = 0.6
    best, beams, scores = BeamSearch(beam_size=3, length_penalty=alpha,
                                     max_decoding_length=10)(model, source, return_all=True)
    beams, scores = to_np(beams), to_np(scores)
    assert_array_equal(to_np(best), beams[:, 0])
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # sorted best first
    for b in range(len(source)):
        for k in range(3):
            log_p, n = sequence_log_prob(model, source[b], beams[b, k])
            expected = log_p / ((5 + n) / 6) ** alpha
            assert scores[b, k] == pytest.approx(expected, abs=1e-3)


def test_cached_beam_equals_recompute(model, source):
    a = to_np(BeamSearch(beam_size=3, max_decoding_length=10)(model, source))
    b = to_np(BeamSearch(beam_size=3, max_decoding_length=10)(model, source,
                                                        use_cache=False))
    assert_array_equal(a, b)


def test_length_penalty_formula():
    assert float(length_penalty(1, 0.6)) == pytest.approx(1.0)
    assert float(length_penalty(10, 0.6)) == pytest.approx((15 / 6) ** 0.6)
    assert float(length_penalty(7, 0.0)) == 1.0


def test_decoding_bad_input(model, source):
    with pytest.raises(TypeError, match="encoder_tokens.*float"):
        GreedySearch()(model, source.astype("float32"))
    with pytest.raises(ValueError, match="beam_size"):
        BeamSearch(beam_size=0)(model, source)
    with pytest.raises(ValueError, match="max_decoding_length"):
        GreedySearch(max_decoding_length=24)(model, source)
    with pytest.raises(ValueError, match="end_id=-1"):
        BeamSearch(beam_size=2)(model, source, end_id=-1)


def _end_at_five_model():
    """A toy model whose every step's arg max is id 5 (its logits are the
    output bias alone)."""
    model, projection = _untied_model(vocab=8, max_sequence_length=12, seed=0)
    kernel, bias = projection.get_weights()
    bias[:] = 0.0
    bias[5] = 30.0
    projection.set_weights([np.zeros_like(kernel), bias])
    return model


@records_steps
@pytest.mark.parametrize("static_cache", [False, True])
def test_searches_take_their_special_ids_as_arguments(static_cache):
    """Issue #41: the searches read no module-level ids. With END = 5 (a
    toy model that always emits 5) every sentence stops at its first token
    and the rest is the given pad_id; with the default END (3) the same
    model runs to each sentence's limit. The decoder starts from start_id;
    a sentence's own length (its limit) counts the ids that are not
    pad_id."""
    model = _end_at_five_model()
    pad, start = 1, 4
    source = np.array([[6, 7, 6, 7], [7, 6, pad, pad]], "int32")
    ids = dict(start_id=start, end_id=5, pad_id=pad, static_cache=static_cache)
    for make in (GreedySearch, lambda **kw: BeamSearch(beam_size=2, **kw)):
        rec = _Recorder(model)
        out = to_np(make()(rec, source, **ids))
        assert out.shape == (2, 11)  # width 4 + 50, capped at 12 - 1
        assert_array_equal(out[:, 0], [5, 5])
        assert (out[:, 1:] == pad).all()
        assert (rec.fed[0] == start).all()  # START = start_id
        # The default END (3) never comes: 5 until each sentence's limit.
        default = to_np(make(max_decoding_length=6)(
            model, source, static_cache=static_cache))
        assert_array_equal(default, np.full((2, 6), 5))


@pytest.mark.tensorflow  # the Translator's in-graph tokenizer
@pytest.mark.parametrize("beam_size", [1, 2])
def test_translator_passes_its_tokenizers_special_ids(beam_size):
    """``Translator`` searches with its tokenizer's ``end_id`` (here 5):
    the source ends with it and the search stops at it."""
    import tensorflow as tf

    from keras_trm.decoding import Translator
    from keras_trm.text import RESERVED_TOKENS, TextTokenizer

    class EndAtFive(TextTokenizer):
        end_id = 5

    vocab = list(RESERVED_TOKENS) + ["a", "b", "c", "d"]
    translator = Translator(_end_at_five_model(), EndAtFive(vocab),
                            search=search_strategy(beam_size=beam_size))
    assert (translator.start_id, translator.end_id, translator.pad_id) == (
        START_ID, 5, PAD_ID)
    tokens = to_np(translator.encode_text(tf.constant(["a c", "d"])))
    assert_array_equal(tokens, [[4, 6, 5], [7, 5, PAD_ID]])
    ids = to_np(translator.generate_ids(tf.constant(tokens)))
    assert (ids[:, 0] == 5).all() and (ids[:, 1:] == PAD_ID).all()


def test_a_model_with_the_old_positions_attribute_still_decodes():
    """A ``DecodingModel`` written before the rename (``max_length``, no
    ``max_sequence_length``): the same ids, with a DeprecationWarning."""
    model = _end_at_five_model()
    source = np.array([[6, 7, 3], [7, 3, 0]], "int32")

    class Old:
        def __init__(self, model):
            self._model = model
            self.max_length = model.max_sequence_length

        def __getattr__(self, name):
            if name == "max_sequence_length":
                raise AttributeError(name)
            return getattr(self._model, name)

    with pytest.deprecated_call(match="max_sequence_length"):
        out = to_np(GreedySearch()(Old(model), source))
    assert_array_equal(out, to_np(GreedySearch()(model, source)))


def test_corpus_bleu_uses_sacrebleu():
    refs = ["Ein Mann läuft über die Straße.", "Zwei Hunde spielen im Schnee."]
    score, signature, line = corpus_bleu(refs, refs)
    assert score == pytest.approx(100.0)
    assert "tok:13a" in signature and "case:mixed" in signature
    score, _, _ = corpus_bleu(["Ein Mann läuft.", "Zwei Katzen schlafen."], refs)
    assert 0 < score < 100
    with pytest.raises(ValueError, match="hypotheses"):
        corpus_bleu(["a"], refs)


class _Recorder:
    """Wraps a ``Transformer`` and records what the decoder is fed."""

    def __init__(self, model):
        self._model = model
        self.fed = []

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decode_step(self, tokens, *args, **kwargs):
        self.fed.append(to_np(tokens))
        return self._model.decode_step(tokens, *args, **kwargs)

    def decode(self, tokens, *args):
        self.fed.append(to_np(tokens))
        return self._model.decode(tokens, *args)


# The seeded random model ends a hypothesis before the others only with
# TensorFlow's draws (JAX's and PyTorch's end every beam at step 1).
@pytest.mark.tensorflow
def test_beam_stays_full_after_a_hypothesis_ends(model, source):
    """Beam 2: once one hypothesis has ended, two live ones are extended."""
    seen_end_then_two_live = 0
    for b in range(len(source)):
        rec = _Recorder(model)
        _, beams, _ = BeamSearch(beam_size=2, length_penalty=0.6,
                                 max_decoding_length=10)(rec, source[b:b + 1],
                                                         use_cache=False, return_all=True)
        # rec.fed[i]: the (2, i + 1) prefixes fed at step i (START first).
        for i, prefixes in enumerate(rec.fed[1:], start=1):
            assert not (prefixes == END_ID).any()  # only live hypotheses
            assert not np.array_equal(prefixes[0], prefixes[1])
        ended = [int(np.argmax(h == END_ID)) + 1
                 for h in to_np(beams)[0] if (h == END_ID).any()]
        if ended and min(ended) < len(rec.fed):
            seen_end_then_two_live += 1
    assert seen_end_then_two_live > 0


@records_steps
def test_early_stopping_keeps_the_best_and_stops_early(tiny_model, rng):
    source = random_ids(rng, (6, 5), 7, pad_from=[5, 3, 4, 2, 5, 1])
    stopped_early = False
    for alpha in (0.0, 0.6, 1.0, 2.0):
        for k in (2, 4):
            runs = []
            for early in (True, False):
                rec = _Recorder(tiny_model)
                best, _, scores = BeamSearch(beam_size=k, length_penalty=alpha,
                                             max_decoding_length=7, early_stopping=early)(rec, source, return_all=True)
                runs.append((to_np(best), to_np(scores)[:, 0], len(rec.fed)))
            assert_array_equal(runs[0][0], runs[1][0])
            assert_allclose(runs[0][1], runs[1][1], atol=1e-5)
            assert runs[1][2] == 7
            stopped_early |= runs[0][2] < 7
    assert stopped_early


@records_steps
def test_first_end_stops_no_later_and_is_exact_without_length_penalty(
        tiny_model, model, rng):
    """``early_stopping="first_end"`` (CTranslate2's early exit) never
    runs more steps than the exact bound; with α = 0 it returns the same
    hypotheses (the best candidate that ends beats every live one); with
    α > 0 its best can only score lower than the exact search's (which
    finds the best the beam can reach), and somewhere it does stop
    earlier."""
    cases = [(tiny_model, random_ids(rng, (6, 5), 7, pad_from=[5, 3, 4, 2, 5, 1]), 7),
             (model, random_ids(rng, (4, 6), 30, pad_from=[6, 4, 5, 2]), 12)]
    fewer_steps = 0
    for m, source, limit in cases:
        # Each sentence is searched alone (eager, to count its steps), so
        # three settings: no length penalty, and one per beam size with.
        for alpha, k in ((0.0, 4), (0.6, 4), (1.0, 2)):
            runs = {}
            for rule in ("bound", "first_end"):
                for b in range(len(source)):  # one by one: steps per sentence
                    rec = _Recorder(m)
                    best, _, scores = BeamSearch(beam_size=k,
                                                 length_penalty=alpha, max_decoding_length=limit, early_stopping=rule)(rec, source[b:b + 1], return_all=True)
                    runs.setdefault(rule, []).append(
                        (to_np(best)[0], float(to_np(scores)[0, 0]),
                         len(rec.fed)))
            for (b_best, b_score, b_steps), (f_best, f_score, f_steps) in zip(
                    runs["bound"], runs["first_end"]):
                assert f_steps <= b_steps
                fewer_steps += f_steps < b_steps
                assert f_score <= b_score + 1e-5
                if alpha == 0.0:
                    assert_array_equal(f_best, b_best)
                    assert f_steps == b_steps
    assert fewer_steps > 0


def test_first_end_batched_equals_one_by_one(model, source):
    lengths = (source != 0).sum(1)
    best = to_np(BeamSearch(beam_size=3, length_penalty=0.6, max_decoding_length=10,
                      early_stopping="first_end")(model, source))
    for b in range(len(source)):
        one = BeamSearch(beam_size=3, length_penalty=0.6,
                         max_decoding_length=10, early_stopping="first_end")(model, source[b:b + 1, :lengths[b]])
        assert_array_equal(to_np(one)[0], best[b])


@pytest.mark.parametrize("bad", ["first", "", None, 2])
def test_unknown_early_stopping_is_refused(model, source, bad):
    with pytest.raises(ValueError, match=r"early_stopping=.*" + repr(bad)[:4]):
        BeamSearch(beam_size=2, early_stopping=bad)(model, source)


def _untied_model(vocab, max_sequence_length, seed):
    """A one-layer model with an untied output layer, and that layer."""
    keras.utils.set_random_seed(seed)
    model = transformer(vocab, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=max_sequence_length, dropout_rate=0.0,
                        tie_embeddings="none", target_vocabulary_size=vocab)
    return model, model.get_layer("output_projection")


def test_default_limit_is_per_sentence_so_batching_changes_nothing():
    """By default a sentence may generate its own source length + 50
    tokens (§6.1), not the padded batch width's: a short sentence batched
    with a long one gives what it gives alone. A model that never emits END
    runs every sentence to its limit."""
    m, projection = _untied_model(vocab=12, max_sequence_length=80, seed=5)
    kernel, bias = projection.get_weights()
    # Never END; never PAD or START either (as a trained model), or a PAD
    # the random draw favours would be counted as no token below.
    bias[[END_ID, PAD_ID, START_ID]] = -1e4
    projection.set_weights([kernel, bias])
    source = np.zeros((2, 20), "int32")
    source[0, :3] = [5, 6, END_ID]
    source[1, :20] = [4 + i % 7 for i in range(19)] + [END_ID]
    for search in (lambda x: GreedySearch()(m, x),
                   lambda x: BeamSearch(beam_size=2)(m, x),
                   lambda x: BeamSearch(beam_size=3, early_stopping="never")(m, x)):
        batched = to_np(search(source))
        assert batched.shape == (2, 70)
        assert (batched[0] != 0).sum() == 3 + 50 and (batched[1] != 0).sum() == 70
        alone = to_np(search(source[:1, :3]))
        assert_array_equal(alone[0], batched[0, :53])


def test_batched_beam_equals_one_by_one(model, source):
    lengths = (source != 0).sum(1)
    best, beams, scores = BeamSearch(beam_size=3, length_penalty=0.6,
                                     max_decoding_length=10)(model, source, return_all=True)
    for b in range(len(source)):
        one = BeamSearch(beam_size=3, length_penalty=0.6,
                         max_decoding_length=10)(model, source[b:b + 1, :lengths[b]], return_all=True)
        assert_array_equal(to_np(one[0])[0], to_np(best)[b])
        assert_array_equal(to_np(one[1])[0], to_np(beams)[b])
        assert_allclose(to_np(one[2])[0], to_np(scores)[b],
                                   atol=1e-4)


def test_encode_by_length_is_the_encoder_with_less_padding(model, rng):
    """Each group is encoded at its own width: real positions equal the
    whole batch's encoding (float rounding), rows in their own order, for
    more groups than sentences and none."""
    source = random_ids(rng, (7, 9), 30, pad_from=[9, 2, 5, 3, 9, 1, 4])
    real = (source != 0)[:, :, None]
    full = to_np(model.encode(source))
    for groups in (1, 2, 3, 7, 10):
        out = to_np(encode_by_length(model, source, groups))
        assert_allclose(out * real, full * real, atol=1e-5)
        assert encode_by_length(model, source[:0], groups).shape[0] == 0
    for bad, error in ((0, ValueError), (True, TypeError), (1.5, TypeError)):
        with pytest.raises(error, match=f"groups={bad!r}"):
            encode_by_length(model, source, bad)


@pytest.fixture(scope="module")
def tiny_model():
    """7 ids (PAD, UNK, START, END and 3 words) with an untied output layer
    made flat enough that the length penalty decides between outputs of 1,
    2 and 4 tokens; PAD and START are never emitted (as in a trained model).
    """
    model, projection = _untied_model(vocab=7, max_sequence_length=8, seed=3)
    kernel, bias = projection.get_weights()
    kernel = np.random.default_rng(2).normal(0.0, 0.15, kernel.shape)
    bias[:] = 0.0
    bias[END_ID] = 0.5
    bias[[PAD_ID, START_ID]] = -30.0
    projection.set_weights([kernel.astype("float32"), bias])
    return model


def exhaustive_scores(model, source, length, alpha):
    """Every output of at most ``length`` tokens, scored by the model.

    Enumerates all V^length token sequences; each stands for the hypothesis
    cut after its first END, or all ``length`` tokens when it has none (it
    hit its limit). Log-probs come from one teacher-forced pass with the
    decoder cache. Returns ``(hyps (N, length) PAD after END, scores (N,))``.
    """
    vocab = model.target_vocabulary_size
    seqs = np.array(list(itertools.product(range(vocab), repeat=length)),
                    "int32")
    n = len(seqs)
    encoded = keras.ops.repeat(model.encode(source[None]), n, axis=0)
    mask = keras.ops.repeat(keras.ops.not_equal(source[None], 0), n, axis=0)
    cross = model.cross_attention_caches(encoded)
    caches = model.empty_caches(n, length + 1, encoded.dtype)
    inputs = np.concatenate([np.full((n, 1), START_ID, "int32"), seqs], 1)
    cum = np.zeros((n, length))
    total = np.zeros(n)
    for t in range(length):
        logits, caches = model.decode_step(inputs[:, t:t + 1], t, caches,
                                           cross, mask)
        log_p = to_np(keras.ops.log_softmax(logits))
        total = total + log_p[np.arange(n), seqs[:, t]]
        cum[:, t] = total
    is_end = seqs == END_ID
    ends = np.where(is_end.any(1), is_end.argmax(1) + 1, length)
    hyps = np.where(np.arange(length)[None] < ends[:, None], seqs, 0)
    scores = cum[np.arange(n), ends - 1] / ((5 + ends) / 6) ** alpha
    return hyps, scores


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
def test_beam_search_equals_exhaustive_search(tiny_model, alpha):
    """A beam that holds every prefix (7^3) finds the best of all outputs."""
    length, vocab = 4, tiny_model.target_vocabulary_size
    source = np.array([[4, 5, 6, 3, 0], [6, 6, 4, 5, 3], [5, 3, 0, 0, 0]],
                      "int32")
    for early in (True, False):
        best, _, scores = BeamSearch(beam_size=vocab ** (length - 1),
                                     length_penalty=alpha, max_decoding_length=length, early_stopping=early)(tiny_model, source, return_all=True)
        for b in range(len(source)):
            hyps, exact = exhaustive_scores(tiny_model, source[b], length, alpha)
            top = int(np.argmax(exact))
            assert to_np(scores)[b, 0] == pytest.approx(exact[top], abs=1e-4)
            runner_up = np.max(exact[(hyps != hyps[top]).any(1)])
            if exact[top] - runner_up > 1e-4:  # not a tie
                assert_array_equal(to_np(best)[b], hyps[top])


def _small_model(tie, norm_first, seed):
    keras.utils.set_random_seed(seed)
    model = transformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=24, dropout_rate=0.0, tie_embeddings=tie,
                        norm_first=norm_first,
                        target_vocabulary_size=None if tie == "all" else 30)
    weights = model.get_weights()  # sharper outputs: fewer near-ties
    model.set_weights([w * 2.0 for w in weights])
    return model


def test_growing_caches_match_fixed_size_caches(model, source):
    """The step over caches that grow and the same step over fixed-size
    caches (written at the position, the rest masked) give the same logits
    and keys/values; positions not yet written stay zero."""
    n, steps = len(source), 5
    encoded = model.encode(source)
    mask = keras.ops.not_equal(source, 0)
    cross = model.cross_attention_caches(encoded)
    caches = model.empty_caches(n, steps, encoded.dtype)
    fast = model.empty_caches(n, 0, encoded.dtype)
    tokens = random_ids(np.random.default_rng(0), (n, steps), 30)
    for t in range(steps):
        logits, caches = model.decode_step(tokens[:, t:t + 1], t, caches,
                                           cross, mask)
        fast_logits, fast = model.decode_step(tokens[:, t:t + 1], t, fast,
                                              cross, mask, grow=True)
        assert_allclose(fast_logits, logits, atol=1e-5)
        for grown, fixed in zip(fast, caches):
            for g, f in zip(grown, fixed):
                assert g.shape == (n, model.num_heads, t + 1, model.key_dim)
                assert f.shape == (n, model.num_heads, steps, model.key_dim)
                assert_allclose(g, f[:, :, :t + 1], atol=1e-6)
                assert not np.any(to_np(f)[:, :, t + 1:])


def test_decode_step_shares_one_cross_cache_row_per_sentence(model, source):
    """k hypotheses per sentence over one cross-attention cache row per
    sentence (what beam search passes) give the logits and caches of k
    repeated rows."""
    k, n = 3, len(source)
    encoded = model.encode(source)
    mask = keras.ops.not_equal(source, 0)
    cross = model.cross_attention_caches(encoded)
    repeated = ([tuple(keras.ops.repeat(c, k, axis=0) for c in pair)
                 for pair in cross[0]], cross[1])
    caches = model.empty_caches(n * k, 0, encoded.dtype)
    shared = caches
    tokens = random_ids(np.random.default_rng(1), (n * k, 4), 30)
    for t in range(4):
        logits, caches = model.decode_step(tokens[:, t:t + 1], t, caches,
                                           repeated, keras.ops.repeat(mask, k, 0),
                                           grow=True)
        shared_logits, shared = model.decode_step(tokens[:, t:t + 1], t,
                                                  shared, cross, mask, grow=True)
        assert_allclose(shared_logits, logits, atol=1e-6)
        for a, b in zip(keras.tree.flatten(shared), keras.tree.flatten(caches)):
            assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("tie,norm_first", [("all", False), ("none", True)])
def test_fast_search_equals_fixed_cache_and_recompute(tie, norm_first, rng):
    """The growing head-major cache and the two-stage top-k give the ids
    of the fixed-size cache (the search before them) and of recomputing
    the prefix, over beam sizes and length penalties."""
    model = _small_model(tie, norm_first, seed=5)
    source = random_ids(rng, (5, 7), 30, pad_from=[7, 3, 5, 2, 6])
    greedy = [to_np(GreedySearch(max_decoding_length=12)(model, source, **kw))
              for kw in ({}, {"static_cache": True}, {"use_cache": False})]
    assert_array_equal(greedy[0], greedy[1])
    assert_array_equal(greedy[0], greedy[2])
    for k, alpha in ((2, 0.0), (3, 0.6), (5, 1.0)):
        variants = [{}, {"static_cache": True}]
        if k == 3:
            variants.append({"use_cache": False})
        beam = BeamSearch(beam_size=k, length_penalty=alpha,
                          max_decoding_length=10)
        runs = [beam(model, source, return_all=True, **kw) for kw in variants]
        for other in runs[1:]:
            assert_array_equal(runs[0][1], other[1])
            assert_allclose(runs[0][2], other[2], atol=1e-5)


def test_two_stage_top_k_keeps_tie_order():
    """Tied candidates: the hypothesis, then the token, with the lower
    index wins, as with one top-k over all k * V candidates."""
    keras.utils.set_random_seed(0)
    model = transformer(7, num_layers=1, d_model=8, num_heads=2, d_ff=8,
                        max_sequence_length=8, dropout_rate=0.0, tie_embeddings="none",
                        target_vocabulary_size=7)
    projection = model.get_layer("output_projection")
    kernel, bias = projection.get_weights()
    bias[:] = 0.0
    projection.set_weights([np.zeros_like(kernel), bias])  # all tokens tie
    source = np.array([[4, 5, 3]], "int32")
    _, beams, _ = BeamSearch(beam_size=2, max_decoding_length=3,
                             length_penalty=0.0, early_stopping=False)(model, source, return_all=True)
    # Step 1: tokens 1 and 2 (the lowest ids but PAD=0, which no search
    # emits; END=3 ranks below k). Step 2: hypothesis 0 extended by tokens
    # 1 and 2, and so on.
    assert_array_equal(to_np(beams)[0], [[1, 1, 1], [1, 1, 2]])


@pytest.mark.parametrize("width,k", [(8000, 8), (37000, 8), (1000, 2), (5003, 16),
                                     (8000, 1), (50, 4)])
@pytest.mark.parametrize("kind", ["normal", "ties"])
def test_chunked_top_k_equals_tf_top_k(width, k, kind):
    """``top_k_rows`` (the beam search's per-hypothesis top-2k) gives
    the values, indices and order of a stable sort (tf.math.top_k's), ties (lower index first)
    included, with -inf padding when the chunks do not divide V."""
    rng = np.random.default_rng(width + k)
    if kind == "normal":
        x = rng.normal(size=(32, width)).astype("float32")
    else:  # few distinct values: ties everywhere, within and across chunks
        x = rng.integers(0, 4, size=(32, width)).astype("float32")
    want_indices = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    want_values = np.take_along_axis(x, want_indices, -1)
    values, indices = top_k_rows(keras.ops.convert_to_tensor(x), k)
    assert_array_equal(to_np(values), to_np(want_values))
    assert_array_equal(to_np(indices), to_np(want_indices))


def test_beam_with_chunked_top_k_equals_beam_with_tf_top_k(rng, monkeypatch):
    """A vocabulary large enough for the chunked top-k: the same beams and
    scores as the search with one tf.math.top_k per hypothesis."""
    import keras_trm.decoding.search as search

    keras.utils.set_random_seed(3)
    model = transformer(3000, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=12, dropout_rate=0.0)
    source = rng.integers(4, 3000, size=(3, 5)).astype("int32")
    source[:, -1] = END_ID
    chunked = BeamSearch(beam_size=4, max_decoding_length=8)(model, source, return_all=True)
    monkeypatch.setattr(search, "top_k_rows", keras.ops.top_k)
    plain = BeamSearch(beam_size=4, max_decoding_length=8)(model, source, return_all=True)
    assert_array_equal(to_np(chunked[1]), to_np(plain[1]))
    assert_array_equal(to_np(chunked[2]), to_np(plain[2]))


@pytest.mark.tensorflow  # tf.function with XLA
def test_jit_compiled_searches_equal_graph_searches_over_many_steps(rng):
    """Greedy and beam search compiled whole with XLA (``static_cache``)
    give the graph's ids on a model whose outputs do not end at once (a
    3,000-token vocabulary, 12 steps): the step's input token has a width
    of 1 known when traced (an unknown width, padded by XLA, gave other
    ids from the fourth step on)."""
    keras.utils.set_random_seed(3)
    model = transformer(3000, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                        max_sequence_length=24, dropout_rate=0.0)
    source = rng.integers(4, 3000, size=(3, 6)).astype("int32")
    source[:, -1] = END_ID
    import tensorflow as tf
    for search in (GreedySearch(max_decoding_length=12),
                   BeamSearch(beam_size=3, max_decoding_length=12)):
        graph = to_np(search(model, source))
        jit = tf.function(lambda x: search(model, x, static_cache=True),
                          jit_compile=True)
        assert_array_equal(to_np(jit(source)), graph)


@pytest.mark.tensorflow  # tf.function with XLA
def test_jit_compiled_search_equals_graph_search(model, source):
    """``static_cache=True`` compiles with XLA, runs in a plain graph (the
    batch size known when traced) and gives the same ids either way."""
    import tensorflow as tf
    graph = to_np(BeamSearch(beam_size=3, max_decoding_length=8)(model, source))

    def static(x):
        return BeamSearch(beam_size=3, max_decoding_length=8)(model, x, static_cache=True)

    jit = tf.function(static, jit_compile=True)
    assert_array_equal(to_np(jit(source)), graph)
    assert_array_equal(to_np(tf.function(static)(source)), graph)
    one = source[:1, :int((source[0] != 0).sum())]   # batch 1, a shape case
    assert_array_equal(to_np(tf.function(static)(one)),
                                  to_np(BeamSearch(beam_size=3,
                                             max_decoding_length=8)(model, one)))
