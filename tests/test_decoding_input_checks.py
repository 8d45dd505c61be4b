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

from keras_trm.decoding import beam_search, greedy_search
from keras_trm.models import transformer

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


def beam(model, source, **kwargs):
    return beam_search(model, source, **{"beam_size": 2, **kwargs})


SEARCHES = [greedy_search, beam]


# -- beam_search's beam_size and length_penalty ----------------------------

@pytest.mark.parametrize("bad, error", [
    (float("nan"), ValueError), (float("inf"), ValueError),
    (-1.0, ValueError), ("0.6", TypeError), (True, TypeError),
    (None, TypeError)])
def test_beam_search_refuses_a_bad_length_penalty(model, source, bad, error):
    """NaN scored every hypothesis NaN (ids returned all the same), inf,
    a string and a bool were taken as numbers."""
    with pytest.raises(error, match=rf"length_penalty={bad!r}"):
        beam(model, source, length_penalty=bad, max_decoding_length=4)


@pytest.mark.parametrize("bad, error", [
    (2.7, TypeError), ("3", TypeError), (None, TypeError), (True, TypeError),
    (0, ValueError), (-2, ValueError)])
def test_beam_search_refuses_a_bad_beam_size(model, source, bad, error):
    """2.7 was cut to 2 and "3" read as 3; None failed in int()."""
    with pytest.raises(error, match=rf"beam_size={bad!r}"):
        beam_search(model, source, beam_size=bad, max_decoding_length=4)


def test_beam_search_takes_numpy_numbers(model, source):
    ids = beam_search(model, source, beam_size=np.int64(2),
                      length_penalty=np.float32(0.6), max_decoding_length=4)
    np.testing.assert_array_equal(
        to_numpy(ids), to_numpy(beam(model, source, max_decoding_length=4)))


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
        search(model, source, max_decoding_length=4, **{name: VOCAB})
    # The last id of the vocabulary is fine.
    assert to_numpy(search(model, source, max_decoding_length=4,
                           **{name: VOCAB - 1})).shape == (2, 4)


# -- empty batches, zero-width sources ---------------------------------------

@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("width", [4, 0])
def test_an_empty_batch_gives_an_empty_result(model, search, width):
    """JAX raised "integer modulo by zero", TensorFlow's beam "Cannot
    compute the max of an empty tensor", PyTorch returned (0, steps): now
    every backend returns int32 (0, steps)."""
    empty = np.zeros((0, width), "int32")
    out = search(model, empty, max_decoding_length=6)
    assert tuple(out.shape) == (0, 6)
    assert keras.backend.standardize_dtype(out.dtype) == "int32"
    # The default limit: min(width + 50, max_sequence_length - 1).
    assert tuple(search(model, empty).shape) == (0, 15)


def test_an_empty_batch_with_return_all(model):
    best, beams, scores = beam_search(model, np.zeros((0, 4), "int32"),
                                      beam_size=3, max_decoding_length=5,
                                      return_all=True)
    assert (tuple(best.shape), tuple(beams.shape), tuple(scores.shape)) == (
        (0, 5), (0, 3, 5), (0, 3))
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"


@pytest.mark.parametrize("search", SEARCHES)
def test_a_zero_width_source_is_refused(model, search):
    """A sentence without a position (not even END) failed on an empty
    maximum, in each backend's own words."""
    with pytest.raises(ValueError, match=r"`encoder_tokens` must have at "
                                         r"least one position.*\(2, 0\)"):
        search(model, np.zeros((2, 0), "int32"), max_decoding_length=4)


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
        search(model, source, max_decoding_length=4,
               encoder_outputs=np.zeros(shape, "float32"))


@pytest.mark.parametrize("search", SEARCHES)
def test_integer_encoder_outputs_are_refused(model, source, search):
    with pytest.raises(TypeError, match="`encoder_outputs` must be float.*int32"):
        search(model, source, max_decoding_length=4,
               encoder_outputs=np.zeros((2, 4, 8), "int32"))


@pytest.mark.parametrize("search", SEARCHES)
def test_encoder_outputs_given_are_used(model, source, search):
    np.testing.assert_array_equal(
        to_numpy(search(model, source, max_decoding_length=4,
                        encoder_outputs=model.encode(source))),
        to_numpy(search(model, source, max_decoding_length=4)))


# -- the same on the other backends (from the TensorFlow suite) ------------

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import keras
    from keras_trm.decoding import beam_search, greedy_search
    from keras_trm.models import transformer

    model = transformer(60, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                        max_sequence_length=16)
    source = np.array([[5, 6, 7, 3], [7, 8, 3, 0]], "int32")
    result = {"backend": keras.backend.backend()}
    for name, search in (("greedy", greedy_search),
                         ("beam", lambda *a, **k: beam_search(*a, beam_size=2, **k))):
        out = search(model, np.zeros((0, 4), "int32"), max_decoding_length=6)
        result[name + "_empty"] = [list(out.shape),
                                   keras.backend.standardize_dtype(out.dtype)]
        for case, call in (
                ("zero_width", lambda: search(model, np.zeros((2, 0), "int32"))),
                ("start_id", lambda: search(model, source, start_id=60)),
                ("length_penalty", lambda: beam_search(
                    model, source, length_penalty=float("nan")))):
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
