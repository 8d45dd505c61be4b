"""Greedy and beam search over the key/value cache; sacreBLEU."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import random_ids
from keras_trm.decoding import beam_search, corpus_bleu, greedy_search, length_penalty
from keras_trm.models import TransformerParts, transformer
from keras_trm.text import END_ID, START_ID


@pytest.fixture(scope="module")
def parts():
    tf.keras.utils.set_random_seed(3) if hasattr(tf, "keras") else None
    model = transformer(30, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                        max_length=24, dropout_rate=0.0)
    # Make END reasonably likely so that hypotheses end at different steps.
    emb = model.get_layer("embedding")
    table = emb.embeddings.numpy()
    table[END_ID] *= 3.0
    emb.embeddings.assign(table)
    return TransformerParts(model)


@pytest.fixture
def source(rng):
    return random_ids(rng, (4, 6), 30, pad_from=[6, 4, 5, 2])


def sequence_log_prob(parts, source, hyp):
    """log P(hyp | source) with a full (uncached) forward pass."""
    if (hyp == END_ID).any():
        n = int(np.argmax(hyp == END_ID)) + 1
    else:  # still alive when the search stopped: its tokens up to padding
        n = int(np.argmax(hyp == 0)) if (hyp == 0).any() else len(hyp)
    dec_in = np.concatenate([[START_ID], hyp[: n - 1]])[None].astype("int32")
    logits = parts.model({"encoder_tokens": source[None],
                          "decoder_tokens": dec_in})[0].numpy()
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(sum(log_p[t, hyp[t]] for t in range(n))), n


def test_cached_greedy_equals_recompute(parts, source):
    cached = greedy_search(parts, source, max_length=12).numpy()
    full = greedy_search(parts, source, max_length=12, use_cache=False).numpy()
    np.testing.assert_array_equal(cached, full)
    # After END only padding.
    for row in cached:
        if (row == END_ID).any():
            assert not row[int(np.argmax(row == END_ID)) + 1:].any()


def test_greedy_is_the_argmax_path(parts, source):
    out = greedy_search(parts, source, max_length=6).numpy()
    prefix = np.full((len(source), 1), START_ID, "int32")
    for t in range(6):
        logits = parts.model({"encoder_tokens": source, "decoder_tokens": prefix})
        nxt = np.argmax(logits[:, -1].numpy(), -1).astype("int32")
        done = (prefix[:, 1:] == END_ID).any(1) if t else np.zeros(len(source), bool)
        np.testing.assert_array_equal(out[~done, t], nxt[~done])
        prefix = np.concatenate([prefix, out[:, t:t + 1]], 1)


def test_beam_one_equals_greedy(parts, source):
    greedy = greedy_search(parts, source, max_length=12).numpy()
    for alpha in (0.0, 0.6):
        beam = beam_search(parts, source, beam_size=1, length_penalty_alpha=alpha,
                           max_length=12).numpy()
        np.testing.assert_array_equal(beam, greedy)


def test_beam_scores_are_model_log_probs_with_length_penalty(parts, source):
    alpha = 0.6
    best, beams, scores = beam_search(parts, source, beam_size=3,
                                      length_penalty_alpha=alpha, max_length=10,
                                      return_all=True)
    beams, scores = beams.numpy(), scores.numpy()
    np.testing.assert_array_equal(best.numpy(), beams[:, 0])
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # sorted best first
    for b in range(len(source)):
        for k in range(3):
            log_p, n = sequence_log_prob(parts, source[b], beams[b, k])
            expected = log_p / ((5 + n) / 6) ** alpha
            assert scores[b, k] == pytest.approx(expected, abs=1e-3)


def test_cached_beam_equals_recompute(parts, source):
    a = beam_search(parts, source, beam_size=3, max_length=10).numpy()
    b = beam_search(parts, source, beam_size=3, max_length=10, use_cache=False).numpy()
    np.testing.assert_array_equal(a, b)


def test_length_penalty_formula():
    assert float(length_penalty(1, 0.6)) == pytest.approx(1.0)
    assert float(length_penalty(10, 0.6)) == pytest.approx((15 / 6) ** 0.6)
    assert float(length_penalty(7, 0.0)) == 1.0


def test_decoding_bad_input(parts, source):
    with pytest.raises(TypeError, match="encoder_tokens.*float"):
        greedy_search(parts, source.astype("float32"))
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(parts, source, beam_size=0)
    with pytest.raises(ValueError, match="max_length"):
        greedy_search(parts, source, max_length=24)


def test_corpus_bleu_uses_sacrebleu():
    refs = ["Ein Mann läuft über die Straße.", "Zwei Hunde spielen im Schnee."]
    score, signature, line = corpus_bleu(refs, refs)
    assert score == pytest.approx(100.0)
    assert "tok:13a" in signature and "case:mixed" in signature
    score, _, _ = corpus_bleu(["Ein Mann läuft.", "Zwei Katzen schlafen."], refs)
    assert 0 < score < 100
    with pytest.raises(ValueError, match="hypotheses"):
        corpus_bleu(["a"], refs)
