"""Shared fixtures. Data comes from the one data setting
(``KERAS_TRM_DATA_DIR``, else ``../shared/data`` beside the checkout)."""

import os
import pathlib
import socket

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Child processes (jobs, workers, servers, notebook kernels, scripts) import
# this checkout's keras_trm first, not another copy installed elsewhere.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [
    str(pathlib.Path(__file__).resolve().parents[1]),
    os.environ.get("PYTHONPATH")]))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras_trm  # noqa: E402,F401
from keras_trm.data import load_multi30k, resolve_data_dir  # noqa: E402


def pytest_runtest_setup(item):
    backend = keras.backend.backend()
    if backend != "tensorflow" and item.get_closest_marker("tensorflow"):
        pytest.skip(f"TensorFlow-only code; the backend is {backend}")


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture(scope="session")
def data_dir():
    return resolve_data_dir()


@pytest.fixture(scope="session")
def multi30k_small(data_dir):
    """The first 2,000 real training pairs of Multi30k EN-DE."""
    src, tgt = load_multi30k("train", data_dir)
    return src[:2000], tgt[:2000]


@pytest.fixture(scope="session")
def small_vocab(multi30k_small, tmp_path_factory):
    from keras_trm.text import learn_vocabulary

    src, tgt = multi30k_small
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    return learn_vocabulary(src + tgt, 1000, path)


@pytest.fixture(scope="session")
def tokenizer(small_vocab):
    from keras_trm.text import TextTokenizer

    return TextTokenizer(small_vocab)


def translation_batches(tokenizer, pairs, folder, tokens_per_batch, boundaries,
                        max_train_length, **kwargs):
    """The translation job's route for ``pairs`` held in memory: written
    to ``folder`` as a corpus, prepared (``prepare_translation_data``,
    the job's encoder and vocabulary hash), then ``TokenBatches`` (its
    ``kwargs``). Returns ``(batches, manifest)``."""
    from keras_trm.data import TokenBatches, prepare_translation_data, read_prepared
    from keras_trm.jobs.translation import token_encoder, vocabulary_sha256

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.source", folder / "train.target"
    for path, lines in zip(paths, pairs):
        text = "".join(line + "\n" for line in lines)
        if not path.exists() or path.read_text("utf-8") != text:
            path.write_text(text, "utf-8")
    manifest = prepare_translation_data(
        folder / "prepared", [("train", *paths)], token_encoder(tokenizer),
        len(tokenizer.vocabulary), vocabulary_sha256(tokenizer),
        max_train_length=max_train_length)
    split = read_prepared(folder / "prepared").splits["train"]
    return TokenBatches(split, tokens_per_batch, boundaries, **kwargs), manifest


def fit_input(batches):
    """What ``fit`` takes of an endless ``TokenBatches``: itself, or on
    TensorFlow the job's ``tf_dataset`` (Keras' PyDataset adapter fixes
    the shapes of its first batches, refusing other buckets)."""
    if keras.backend.backend() != "tensorflow":
        return batches
    from keras_trm.jobs.translation import tf_dataset

    return tf_dataset(batches)


to_np = keras.ops.convert_to_numpy


def assert_allclose(actual, desired, **kwargs):
    """``np.testing.assert_allclose`` on any backend's tensors."""
    np.testing.assert_allclose(to_np(actual), to_np(desired), **kwargs)


def assert_array_equal(actual, desired):
    """``np.testing.assert_array_equal`` on any backend's tensors."""
    np.testing.assert_array_equal(to_np(actual), to_np(desired))


def random_ids(rng, shape, vocab, pad_from=None):
    """int32 ids in [1, vocab); rows padded with 0 from pad_from[i]."""
    ids = rng.integers(1, vocab, size=shape).astype("int32")
    if pad_from is not None:
        for i, start in enumerate(pad_from):
            ids[i, start:] = 0
    return ids


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _free_ports(n):
    """``n`` distinct loopback ports that were free a moment ago (all held
    until all are picked). Another process may take one before a server
    binds it; tests that can tell retry with new ports."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
def free_ports():
    """``free_ports(n)``: a list of n distinct free loopback ports."""
    return _free_ports


@pytest.fixture
def compiled():
    """``compiled(fn)``: ``fn`` traced as the backend compiles a step
    (``tf.function``, ``jax.jit``); under PyTorch, ``fn`` itself."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.function
    if backend == "jax":
        import jax
        return jax.jit
    return lambda fn: fn


@pytest.fixture
def gradients():
    """``gradients(fn, *inputs)``: numpy gradients of the scalar
    ``fn(*inputs)`` with respect to each input, on any backend (zeros where
    no gradient reaches an input)."""
    backend = keras.backend.backend()

    def grads(fn, *inputs):
        if backend == "jax":
            import jax
            out = jax.grad(fn, argnums=tuple(range(len(inputs))))(*inputs)
        elif backend == "tensorflow":
            import tensorflow as tf
            inputs = [tf.constant(x) for x in inputs]
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                loss = fn(*inputs)
            out = tape.gradient(loss, inputs)
        else:
            import torch
            inputs = [torch.tensor(x, requires_grad=True) for x in inputs]
            loss = fn(*inputs)
            if loss.requires_grad:  # else nothing it depends on is trained
                loss.backward()
            out = [x.grad for x in inputs]
        return [np.zeros(np.shape(x), "float32") if g is None
                else keras.ops.convert_to_numpy(g)
                for x, g in zip(inputs, out)]

    return grads
