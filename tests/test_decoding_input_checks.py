"""Bad input to the searches, the ``Translator``, the language-model
evaluations and BLEU: a ValueError / TypeError naming the argument and its
value, never a raw backend error, a crash, NaN or a silently wrong result.

The search tests use no TensorFlow and pass on every backend
(``KERAS_BACKEND=jax`` / ``torch``); under TensorFlow one test also runs
the backend-specific cases (an empty batch, a zero-width source, special
ids past the vocabulary) under JAX and PyTorch in child processes."""

import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_trm.decoding import BeamSearch, GreedySearch, search_strategy
from keras_trm.models import transformer

pytestmark = pytest.mark.portable  # CI runs it under each backend

BACKEND = keras.backend.backend()
ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 60


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


@pytest.fixture(scope="module")
def model():
    return transformer(VOCAB, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                       max_sequence_length=16)


@pytest.fixture
def source():
    return np.array([[5, 6, 7, 3], [7, 8, 3, 0]], "int32")


def beam(**kwargs):
    return BeamSearch(beam_size=2, **kwargs)


SEARCHES = [GreedySearch, beam]   # strategy factories


# -- beam_search's beam_size and length_penalty ----------------------------

@pytest.mark.parametrize("bad, error", [
    (float("nan"), ValueError), (float("inf"), ValueError),
    (-1.0, ValueError), ("0.6", TypeError), (True, TypeError),
    (None, TypeError)])
def test_beam_search_refuses_a_bad_length_penalty(model, source, bad, error):
    """NaN scored every hypothesis NaN (ids returned all the same), inf,
    a string and a bool were taken as numbers."""
    with pytest.raises(error, match=rf"length_penalty={bad!r}"):
        beam(length_penalty=bad, max_decoding_length=4)


@pytest.mark.parametrize("bad, error", [
    (2.7, TypeError), ("3", TypeError), (None, TypeError), (True, TypeError),
    (0, ValueError), (-2, ValueError)])
def test_beam_search_refuses_a_bad_beam_size(model, source, bad, error):
    """2.7 was cut to 2 and "3" read as 3; None failed in int()."""
    with pytest.raises(error, match=rf"beam_size={bad!r}"):
        BeamSearch(beam_size=bad, max_decoding_length=4)(model, source)


def test_beam_search_takes_numpy_numbers(model, source):
    ids = BeamSearch(beam_size=np.int64(2), length_penalty=np.float32(0.6),
                     max_decoding_length=4)(model, source)
    np.testing.assert_array_equal(
        to_numpy(ids), to_numpy(beam(max_decoding_length=4)(model, source)))


def test_strategies_are_values_with_a_config():
    """Equal settings, equal (and equally hashed) strategies: the compiled
    search of one is reused by the other; the config round-trips, with
    True stored as the rule's name."""
    beam = BeamSearch(beam_size=3, length_penalty=1.2, early_stopping=True,
                      max_decoding_length=9)
    assert beam.early_stopping == "bound"
    assert BeamSearch.from_config(beam.get_config()) == beam
    assert hash(BeamSearch(3, 1.2, "bound", 9)) == hash(beam)
    assert GreedySearch.from_config(GreedySearch(7).get_config()) == GreedySearch(7)
    assert search_strategy(1, length_penalty=1.2) == GreedySearch()
    assert search_strategy(3, 1.2, True, 9) == beam
    with pytest.raises(TypeError, match="max_decoding_length=2.0"):
        GreedySearch(max_decoding_length=2.0)


# -- the special ids ---------------------------------------------------------

@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("name", ["start_id", "end_id", "pad_id"])
def test_special_ids_past_the_target_vocabulary_are_refused(model, source,
                                                           search, name):
    """start_id=V read a row of NaN under JAX (every output PAD), failed
    in the embedding on TensorFlow and PyTorch; end_id and pad_id = V were
    taken (END never found, ids outside the vocabulary written)."""
    with pytest.raises(ValueError, match=rf"`{name}` must be an id in "
                                         rf"\[0, {VOCAB}\).*{name}={VOCAB}$"):
        search(max_decoding_length=4)(model, source, **{name: VOCAB})
    # The last id of the vocabulary is fine.
    assert to_numpy(search(max_decoding_length=4)(model, source,
                           **{name: VOCAB - 1})).shape == (2, 4)


# -- empty batches, zero-width sources ---------------------------------------

@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("width", [4, 0])
def test_an_empty_batch_gives_an_empty_result(model, search, width):
    """JAX raised "integer modulo by zero", TensorFlow's beam "Cannot
    compute the max of an empty tensor", PyTorch returned (0, steps): now
    every backend returns int32 (0, steps)."""
    empty = np.zeros((0, width), "int32")
    out = search(max_decoding_length=6)(model, empty)
    assert tuple(out.shape) == (0, 6)
    assert keras.backend.standardize_dtype(out.dtype) == "int32"
    # The default limit: min(width + 50, max_sequence_length - 1).
    assert tuple(search()(model, empty).shape) == (0, 15)


def test_an_empty_batch_with_return_all(model):
    best, beams, scores = BeamSearch(beam_size=3, max_decoding_length=5)(model, np.zeros((0, 4), "int32"), return_all=True)
    assert (tuple(best.shape), tuple(beams.shape), tuple(scores.shape)) == (
        (0, 5), (0, 3, 5), (0, 3))
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"


@pytest.mark.parametrize("search", SEARCHES)
def test_a_zero_width_source_is_refused(model, search):
    """A sentence without a position (not even END) failed on an empty
    maximum, in each backend's own words."""
    with pytest.raises(ValueError, match=r"`encoder_tokens` must have at "
                                         r"least one position.*\(2, 0\)"):
        search(max_decoding_length=4)(model, np.zeros((2, 0), "int32"))


# -- encoder_outputs -------------------------------------------------------

@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("shape", [(3, 4, 8), (2, 4, 4), (2, 5, 8), (2, 4)])
def test_encoder_outputs_of_the_wrong_shape_are_refused(model, source,
                                                        search, shape):
    """The wrong batch, width or d_model failed deep in the decoder with
    each backend's own shape error."""
    with pytest.raises(ValueError, match=r"`encoder_outputs` must have shape "
                       r"\(batch, T_src, d_model\) = \(2, 4, 8\).*"
                       + rf"{tuple(shape)}".replace("(", r"\(").replace(")", r"\)")):
        search(max_decoding_length=4)(model, source,
               encoder_outputs=np.zeros(shape, "float32"))


@pytest.mark.parametrize("search", SEARCHES)
def test_integer_encoder_outputs_are_refused(model, source, search):
    with pytest.raises(TypeError, match="`encoder_outputs` must be float.*int32"):
        search(max_decoding_length=4)(model, source,
               encoder_outputs=np.zeros((2, 4, 8), "int32"))


@pytest.mark.parametrize("search", SEARCHES)
def test_encoder_outputs_given_are_used(model, source, search):
    np.testing.assert_array_equal(
        to_numpy(search(max_decoding_length=4)(model, source,
                        encoder_outputs=model.encode(source))),
        to_numpy(search(max_decoding_length=4)(model, source)))


# -- the same on the other backends (from the TensorFlow suite) ------------

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import keras
    from keras_trm.decoding import BeamSearch, GreedySearch
    from keras_trm.models import transformer

    model = transformer(60, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                        max_sequence_length=16)
    source = np.array([[5, 6, 7, 3], [7, 8, 3, 0]], "int32")
    result = {"backend": keras.backend.backend()}
    for name, search in (("greedy", GreedySearch), ("beam", BeamSearch)):
        out = search(max_decoding_length=6)(model, np.zeros((0, 4), "int32"))
        result[name + "_empty"] = [list(out.shape),
                                   keras.backend.standardize_dtype(out.dtype)]
        for case, call in (
                ("zero_width", lambda: search()(model, np.zeros((2, 0), "int32"))),
                ("start_id", lambda: search()(model, source, start_id=60)),
                ("length_penalty", lambda: BeamSearch(
                    length_penalty=float("nan"))(model, source))):
            try:
                call()
                result[f"{name}_{case}"] = "no error"
            except ValueError as error:
                result[f"{name}_{case}"] = str(error)
    print(json.dumps(result))
""")


@pytest.mark.skipif(BACKEND != "tensorflow",
                    reason="run once, from the TensorFlow suite")
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_other_backends_agree(backend):
    pytest.importorskip(backend)
    env = dict(os.environ, KERAS_BACKEND=backend)
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["backend"] == backend
    for name in ("greedy", "beam"):
        assert result[name + "_empty"] == [[0, 6], "int32"]
        assert "`encoder_tokens` must have at least one position" in result[
            name + "_zero_width"]
        assert "start_id=60" in result[name + "_start_id"]
        assert "length_penalty=nan" in result[name + "_length_penalty"]


# -- Translator ------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    from keras_trm.text import RESERVED_TOKENS, TextTokenizer

    return TextTokenizer(list(RESERVED_TOKENS)
                         + [f"w{i}" for i in range(VOCAB - len(RESERVED_TOKENS))])


def test_translator_refuses_a_tokenizer_of_another_size(model):
    """A tokenizer smaller than the model's output vocabulary crashed the
    process (a segfault in detokenize) at the first translate; the source
    side is checked too."""
    from keras_trm.decoding import Translator
    from keras_trm.text import RESERVED_TOKENS, TextTokenizer

    small = TextTokenizer(list(RESERVED_TOKENS) + list("abcdef"))
    with pytest.raises(ValueError, match=r"`tokenizer` has 10 tokens "
                       r"\(vocabulary_size=10\) but the model's target "
                       rf"vocabulary has {VOCAB}"):
        Translator(model, small, search=GreedySearch())
    untied = transformer(60, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                         max_sequence_length=16, tie_embeddings="none",
                         target_vocabulary_size=10)
    with pytest.raises(ValueError, match=r"model's source vocabulary has 60"):
        Translator(untied, small)


def test_translator_refuses_tokenizer_special_ids_past_the_vocabulary(
        model, tokenizer):
    from keras_trm.decoding import Translator
    from keras_trm.text import TextTokenizer

    class FarEnd(TextTokenizer):
        end_id = VOCAB

    with pytest.raises(ValueError, match=rf"end_id={VOCAB}"):
        Translator(model, FarEnd(tokenizer.vocabulary))


@pytest.mark.parametrize("name, bad, error", [
    ("max_source_length", 0, ValueError), ("max_source_length", 1, ValueError),
    ("max_source_length", 17, ValueError),
    ("max_source_length", 2.5, TypeError),
    ("max_source_length", True, TypeError),
    ("search", "beam", TypeError), ("search", 4, TypeError),
    ("beam_size", 2, TypeError), ("length_penalty", 0.6, TypeError),
    ("early_stopping", "first_end", TypeError)])
def test_translator_refuses_bad_arguments_at_construction(model, tokenizer,
                                                          name, bad, error):
    """max_source_length=0 silently meant the default and 2.5 became 2; a
    search that is not a strategy, and the search settings once passed
    one by one (now ``search=BeamSearch(...)``), are refused by name."""
    from keras_trm.decoding import Translator

    with pytest.raises(error, match=rf"{name}={bad!r}"):
        Translator(model, tokenizer, **{name: bad})
    if name in ("beam_size", "length_penalty", "early_stopping"):
        with pytest.raises(TypeError, match=rf"search=BeamSearch\({name}="):
            Translator(model, tokenizer, **{name: bad})


def test_translator_checks_the_search_against_the_model(model, tokenizer):
    """A decoding limit past the model's 16 positions fails when the
    translator is made, not at its first translation."""
    from keras_trm.decoding import Translator

    with pytest.raises(ValueError, match=r"max_decoding_length=16"):
        Translator(model, tokenizer, search=BeamSearch(max_decoding_length=16))
    assert Translator(model, tokenizer, search=GreedySearch(
        max_decoding_length=15)).search == GreedySearch(15)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (0, ValueError),
                                        (2.5, TypeError), (True, TypeError)])
def test_translate_texts_refuses_a_bad_batch_size(model, tokenizer, bad, error):
    """batch_size=-1 returned [] (every sentence lost), 0 raised range()'s
    own error."""
    from keras_trm.decoding import Translator

    translator = Translator(model, tokenizer, search=GreedySearch())
    with pytest.raises(error, match=rf"batch_size={bad!r}"):
        translator.translate_texts(["w1 w2"], batch_size=bad)


@pytest.mark.tensorflow  # the Translator's in-graph tokenizer
def test_translator_translates_an_empty_batch(model, tokenizer):
    """No sentence in, none out, on every backend (the backend search gets
    a (0, 0) source)."""
    from keras_trm.decoding import Translator

    for beam_size in (1, 2):
        translator = Translator(model, tokenizer,
                                search=search_strategy(beam_size=beam_size), max_source_length=8)
        assert translator.translate_texts([]) == []
        assert translator.translate_texts(["w1 w2", " "], batch_size=1)[1] == ""
        if BACKEND == "tensorflow":
            import tensorflow as tf

            assert translator.translate(tf.constant([], tf.string)).shape == (0,)
        else:
            import tensorflow as tf

            assert translator._translate_on_backend(
                tf.constant([], tf.string)).shape == (0,)


# -- language-model evaluation (TensorFlow) ---------------------------------

@pytest.fixture(scope="module")
def language_models():
    from keras_trm.models import TransformerXLLM, vanilla_transformer_lm

    xl = TransformerXLLM(7, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                         mem_len=4, max_segment_len=4)
    vanilla = vanilla_transformer_lm(7, 1, 8, 2, 16, max_sequence_length=4)
    return xl, vanilla


def _evaluations(language_models):
    from keras_trm.decoding.lm_evaluation import (evaluate_disjoint_segments,
                                                  evaluate_sliding_window,
                                                  evaluate_with_memory)

    xl, vanilla = language_models
    return {"with_memory": lambda s: evaluate_with_memory(xl, s, 4),
            "disjoint": lambda s: evaluate_disjoint_segments(vanilla, s, 4),
            "sliding": lambda s: evaluate_sliding_window(vanilla, s, 4)}


lm_only = pytest.mark.skipif(BACKEND != "tensorflow",
                             reason="the evaluations are tf.function loops")


@lm_only
@pytest.mark.parametrize("kind", ["with_memory", "disjoint", "sliding"])
def test_lm_evaluations_refuse_bad_streams(language_models, kind):
    """Ids >= V failed inside the graph (InvalidArgumentError), float
    streams were cut to ints silently, and an empty batch divided by zero
    (sliding) or blamed batch_size (with memory)."""
    evaluate = _evaluations(language_models)[kind]
    streams = np.ones((2, 9), "int32")
    streams[1, 3] = 7
    with pytest.raises(ValueError, match=r"`streams` must be ids in \[0, 7\) "
                       r".*streams\[1, 3\]=7"):
        evaluate(streams)
    with pytest.raises(TypeError, match=r"`streams` must be integer token "
                                        r"ids, got dtype float32"):
        evaluate(np.full((2, 9), 1.7, "float32"))
    with pytest.raises(ValueError, match=r"`streams` of shape \(0, 5\) hold "
                                         r"no stream"):
        evaluate(np.ones((0, 5), "int32"))
    assert math.isfinite(evaluate(np.ones((2, 9), "int32")))


@lm_only
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError),
                                        ("x", TypeError), (1.5, TypeError)])
def test_evaluate_with_memory_refuses_a_bad_max_segments(language_models, bad,
                                                         error):
    """0 and -1 blamed the data ("streams ... hold no (input, target)
    pair"), "x" raised a bare comparison TypeError, 1.5 meant 2."""
    from keras_trm.decoding.lm_evaluation import evaluate_with_memory

    with pytest.raises(error, match=rf"max_segments={bad!r}"):
        evaluate_with_memory(language_models[0], np.ones((2, 9), "int32"), 4,
                             max_segments=bad)


# -- BLEU --------------------------------------------------------------------

@pytest.mark.parametrize("metric", ["corpus_bleu", "tokenized_bleu",
                                    "compound_split_bleu"])
def test_bleu_of_an_empty_corpus_is_refused(metric):
    """sacreBLEU has no score for an empty corpus (it raised a bare
    IndexError)."""
    from keras_trm.decoding import bleu

    with pytest.raises(ValueError, match=r"`hypotheses` and `references` "
                                         r"must hold at least one sentence, got 0"):
        getattr(bleu, metric)([], [])
    assert getattr(bleu, metric)(["a b c d"], ["a b c d"])[0] == pytest.approx(100.0)
