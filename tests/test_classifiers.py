"""IMDB / MNIST loaders and the classifiers built on them (real data)."""

import keras
import numpy as np
import pytest

from conftest import to_np
from keras_trm.data.imdb import load_imdb
from keras_trm.data.mnist import load_mnist
from keras_trm.models.classifiers import (
    ClassifierModel,
    encoder_classifier,
    lenet_cnn,
    lstm_classifier,
)

pytestmark = pytest.mark.portable  # CI runs it under each backend
VOCAB = 60


@pytest.fixture(scope="module")
def imdb_train(data_dir):
    return load_imdb("train", data_dir)


@pytest.fixture(scope="module")
def mnist_train(data_dir):
    return load_mnist("train", data_dir)


def _ids(rng, shape, pad_from=None):
    ids = rng.integers(1, VOCAB, size=shape).astype("int32")
    for i, start in enumerate(pad_from or []):
        ids[i, start:] = 0
    return ids


# --- loaders -----------------------------------------------------------------


def test_imdb_counts(imdb_train, data_dir):
    texts, labels = imdb_train
    assert len(texts) == 25_000 and labels.shape == (25_000,)
    assert labels.dtype == np.int32
    assert np.bincount(labels).tolist() == [12_500, 12_500]
    assert all(isinstance(t, str) and t for t in texts[:100])
    assert not any("<br />" in t for t in texts)
    test_texts, test_labels = load_imdb("test", data_dir)
    assert len(test_texts) == 25_000
    assert np.bincount(test_labels).tolist() == [12_500, 12_500]


def test_imdb_keeps_raw_text_when_asked(data_dir):
    raw, _ = load_imdb("train", data_dir, replace_breaks=False)
    assert any("<br />" in t for t in raw)


def test_mnist_counts_and_mean(mnist_train, data_dir):
    images, labels = mnist_train
    assert images.shape == (60_000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (60_000,) and labels.dtype == np.uint8
    assert images.mean() / 255.0 == pytest.approx(0.1307, abs=1e-4)
    assert np.bincount(labels)[:3].tolist() == [5923, 6742, 5958]
    test_images, test_labels = load_mnist("test", data_dir)
    assert test_images.shape == (10_000, 28, 28)
    assert test_labels.shape == (10_000,)


def test_loaders_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"imdb_test\.jsonl\.gz.*imdb"):
        load_imdb("test", tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"t10k-images-idx3-ubyte\.gz.*mnist"
    ):
        load_mnist("test", tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_imdb("valid", tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_mnist("valid", tmp_path)


def test_mnist_bad_idx_header(tmp_path):
    import gzip

    folder = tmp_path / "mnist"
    folder.mkdir()
    header = np.array([2049, 2, 28, 28], ">i4").tobytes()  # labels magic
    with gzip.open(folder / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(header + bytes(2 * 28 * 28))
    labels = np.array([2049, 2], ">i4").tobytes() + bytes(2)
    with gzip.open(folder / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(labels)
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        load_mnist("test", tmp_path)
    header = np.array([2051, 3, 28, 28], ">i4").tobytes()  # 3 != 2 images
    with gzip.open(folder / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(header + bytes(2 * 28 * 28))
    with pytest.raises(ValueError, match=r"shape \(3, 28, 28\)"):
        load_mnist("test", tmp_path)


# --- builders ------------------------------------------------------------------


SEQUENCE_MODELS = {
    "lstm": lambda: lstm_classifier(VOCAB, embedding_dim=8, units=8),
    "lstm_ln_bi": lambda: lstm_classifier(
        VOCAB, embedding_dim=8, units=8, layer_norm=True, bidirectional=True
    ),
    "encoder_mean": lambda: encoder_classifier(
        VOCAB, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_sequence_length=16
    ),
    "encoder_cls_sin": lambda: encoder_classifier(
        VOCAB, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_sequence_length=16,
        pooling="cls", position="sinusoidal", num_classes=3,
    ),
}


@pytest.mark.parametrize("kind", sorted(SEQUENCE_MODELS))
def test_sequence_classifier_round_trip(kind, rng, tmp_path):
    model = SEQUENCE_MODELS[kind]()
    assert isinstance(model, ClassifierModel)
    assert model.inputs[0].name == "token_ids"
    ids = _ids(rng, (3, 9), pad_from=[9, 5, 2])
    probs = to_np(model(ids))
    assert probs.dtype == np.float32 and probs.shape[0] == 3
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    path = tmp_path / f"{kind}.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ClassifierModel)
    np.testing.assert_array_equal(to_np(loaded(ids)), probs)
    with pytest.raises(TypeError, match="token_ids.*float32"):
        loaded(ids.astype("float32"))


@pytest.mark.parametrize("norm", [None, "batch", "layer"])
def test_lenet_round_trip(norm, mnist_train, tmp_path):
    model = lenet_cnn(norm=norm)
    assert model.inputs[0].name == "images"
    images = mnist_train[0][:4]
    probs = to_np(model(images))
    assert probs.shape == (4, 10) and probs.dtype == np.float32
    np.testing.assert_allclose(
        to_np(model(images.astype("float32"))), probs, atol=1e-6
    )
    path = tmp_path / "lenet.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_np(loaded(images)), probs)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_encoder_mean_pooling_ignores_padding(position, rng):
    model = encoder_classifier(
        VOCAB, num_layers=2, d_model=16, num_heads=2, d_ff=32, max_sequence_length=32,
        position=position,
    )
    ids = _ids(rng, (3, 8), pad_from=[8, 5, 1])
    probs = to_np(model(ids))
    padded = np.pad(ids, ((0, 0), (0, 10)))
    np.testing.assert_allclose(to_np(model(padded)), probs, atol=1e-6)
    # The pooled vector depends on the real tokens.
    changed = ids.copy()
    changed[0, 0] = changed[0, 0] % (VOCAB - 1) + 1
    assert not np.allclose(to_np(model(changed))[0], probs[0])


def test_bad_arguments_and_inputs(rng):
    with pytest.raises(ValueError, match=r"`norm`.*norm='group'"):
        lenet_cnn(norm="group")
    with pytest.raises(ValueError, match="num_classes"):
        lenet_cnn(num_classes=1)
    with pytest.raises(ValueError, match="pooling"):
        encoder_classifier(VOCAB, pooling="max")
    with pytest.raises(ValueError, match="d_model.*num_heads"):
        encoder_classifier(VOCAB, d_model=10, num_heads=4)
    with pytest.raises(ValueError, match="dropout_rate"):
        lstm_classifier(VOCAB, dropout_rate=1.0)
    with pytest.raises(TypeError, match="units"):
        lstm_classifier(VOCAB, units=2.5)

    cnn = lenet_cnn()
    with pytest.raises(ValueError):
        cnn(np.zeros((2, 32, 32), np.uint8))
    encoder = SEQUENCE_MODELS["encoder_mean"]()
    with pytest.raises(TypeError, match="float32"):
        encoder(_ids(rng, (2, 5)).astype("float32"))
    with pytest.raises(ValueError, match="max_sequence_length=16"):
        encoder(_ids(rng, (2, 17)))


# --- training on real data -------------------------------------------------------


def _train_and_compare(model, x, y, epochs, batch_size, learning_rate):
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
    )
    before = model.evaluate(x, y, batch_size=128, verbose=0)
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True,
              verbose=0)
    after = model.evaluate(x, y, batch_size=128, verbose=0)
    return before, after


def test_lstm_ln_classifier_trains_on_imdb(imdb_train):
    texts, labels = imdb_train
    # 128 negative and 128 positive reviews (the file is sorted by label).
    idx = np.r_[0:128, 12_500:12_628]
    texts = [texts[i] for i in idx]
    labels = labels[idx]
    vectorizer = keras.layers.TextVectorization(
        max_tokens=4000, output_sequence_length=200
    )
    vectorizer.adapt(texts)
    ids = to_np(vectorizer(texts)).astype("int32")
    assert ids.shape == (256, 200) and ids.max() < 4000
    model = lstm_classifier(
        4000, embedding_dim=16, units=16, layer_norm=True, dropout_rate=0.0
    )
    before, after = _train_and_compare(
        model, ids, labels, epochs=6, batch_size=32, learning_rate=1e-2
    )
    assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("norm", [None, "layer"])
def test_lenet_trains_on_mnist(norm, mnist_train):
    images, labels = mnist_train
    x, y = images[:512], labels[:512]
    model = lenet_cnn(norm=norm)
    before, after = _train_and_compare(
        model, x, y, epochs=3, batch_size=32, learning_rate=3e-3
    )
    assert after < 0.8 * before, (before, after)
