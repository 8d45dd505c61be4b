"""The IMDB and MNIST jobs: preprocessing, bad input, per-step logging,
reports, and their SavedModels reloaded in a fresh process without
keras_trm (tiny models trained for a few steps on real data)."""

import keras_trm  # noqa: F401, I001  (checks the TensorFlow backend first)

import collections
import json
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_trm.cli import config_parser, parse_config
from keras_trm.data import check_labels, load_imdb, load_mnist, validation_split
from keras_trm.text import truncate_head_tail
from keras_trm.data.batching import (
    bucket_widths,
    labelled_bucket_batches,
    labelled_bucket_steps,
)
from keras_trm.export import DigitClassifier, ReviewClassifier, export_module
from keras_trm.jobs import imdb, mnist
from keras_trm.training import BatchLoss, StepLog, compile_classifier, restore_best_epoch
from keras_trm.models import lenet_cnn, text_classifier
from keras_trm.text import RESERVED_TOKENS, encode_lowercase, lowercase

MAX_LENGTH = 24
REVIEWS = [
    "A wonderful film, I loved every minute of it.",
    "",
    "Terrible. " * 400,                 # far longer than MAX_LENGTH tokens
    "Ein großartiger Film — très bien!",
]

FRESH = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # registers the tokenizer ops of the text model
    request = json.loads(sys.stdin.read())
    text = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    digits = tf.saved_model.load(sys.argv[2]).signatures["serving_default"]
    p_text = text(reviews=tf.constant(request["reviews"]))["probabilities"]
    images = np.asarray(request["images"], dtype=np.uint8)
    p_digits = digits(images=tf.constant(images))["probabilities"]
    assert "keras_trm" not in sys.modules
    print(json.dumps({"text": p_text.numpy().tolist(),
                      "digits": p_digits.numpy().tolist()}))
""")


@pytest.fixture(scope="module")
def reviews(data_dir):
    texts, labels = load_imdb("train", data_dir)
    pick = np.r_[0:150, 12_500:12_650]          # 150 negative, 150 positive
    return [texts[i] for i in pick], labels[pick]


@pytest.fixture(scope="module")
def review_vocab(reviews):
    """A small WordPiece vocabulary: the 300 commonest words, every single
    character and its ``##`` continuation (built directly: the learner is
    slow and tested elsewhere)."""
    words = collections.Counter(
        w for text in lowercase(reviews[0])
        for w in re.findall(r"\w+|[^\w\s]", text))
    chars = sorted({c for w in words for c in w})
    common = [w for w, _ in words.most_common(300) if len(w) > 1]
    return list(RESERVED_TOKENS) + chars + [f"##{c}" for c in chars] + common


@pytest.fixture(scope="module")
def digits(data_dir):
    images, labels = load_mnist("train", data_dir)
    test_images, test_labels = load_mnist("test", data_dir)
    return ((images[:512], labels[:512]), (images[512:712], labels[512:712]),
            (test_images[:200], test_labels[:200]))


def _tiny_imdb_config(**kwargs):
    return imdb.ImdbConfig(
        max_length=MAX_LENGTH, batch_size=16, d_model=16, num_heads=2,
        d_ff=32, embedding_dim=16, units=8, encoder_epochs=1, lstm_epochs=1,
        warmup_steps=2, jit_compile="off", **kwargs)


@pytest.fixture(scope="module")
def review_classifier(reviews, review_vocab):
    """An LSTM_LN classifier trained for a few steps on 300 real reviews."""
    keras.utils.set_random_seed(0)
    config = _tiny_imdb_config()
    model = text_classifier("lstm_ln", len(review_vocab),
                            **imdb.classifier_options("lstm_ln", config))
    classifier = ReviewClassifier(model, review_vocab, MAX_LENGTH)
    ids = encode_lowercase(classifier.tokenizer, reviews[0], MAX_LENGTH)
    compile_classifier(model, **imdb.compile_options("lstm_ln", config, 10))
    model.fit(labelled_bucket_batches(ids, reviews[1], 16, MAX_LENGTH, shuffle=True,
                                drop_remainder=True), epochs=1, steps_per_epoch=10,
              verbose=0)
    return classifier


@pytest.fixture(scope="module")
def digit_run(digits):
    """A BatchNorm LeNet trained for one epoch of 512 real digits."""
    config = mnist.MnistConfig(epochs=1, jit_compile=False)
    model, result = mnist.train_one("batch", 64, config, *digits, verbose=0)
    return DigitClassifier(model), result, config


# --- IMDB preprocessing and bad input -------------------------------------------


def test_head_tail_truncation_keeps_first_quarter_and_the_end():
    ids = tf.ragged.constant([list(range(1, 41)), [5, 6, 7], []], tf.int32)
    out = truncate_head_tail(ids, 12).to_list()
    assert out[0] == [1, 2, 3] + list(range(32, 41))   # 12 // 4 = 3 head ids
    assert out[1] == [5, 6, 7] and out[2] == []


def test_empty_and_overlong_reviews_give_defined_probabilities(
        review_classifier, review_vocab):
    encoded = review_classifier.encode(tf.constant(REVIEWS)).numpy()
    assert encoded.shape == (4, MAX_LENGTH) and encoded.dtype == np.int32
    assert not encoded[1].any()                           # empty: all padding
    assert encoded[2].all()                               # long: cut, no padding
    probs = review_classifier.classify_texts(REVIEWS)
    assert probs.shape == (4, 2) and np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    # The empty review is exactly the model's answer for "only padding".
    padding_only = review_classifier.model(np.zeros((1, 5), "int32")).numpy()
    np.testing.assert_allclose(probs[1], padding_only[0], rtol=1e-5, atol=1e-6)
    # A batch holding only empty reviews still has one (padding) column.
    assert review_classifier.encode(tf.constant(["", " "])).shape == (2, 1)
    # The encoder classifier pools nothing for an empty review: no NaN either.
    model = text_classifier("encoder", len(review_vocab), d_model=16,
                            num_heads=2, d_ff=32)
    enc = ReviewClassifier(model, review_vocab, MAX_LENGTH)
    assert np.isfinite(enc.classify_texts(REVIEWS)).all()


def test_review_classifier_rejects_non_strings(review_classifier):
    with pytest.raises(TypeError, match=r"`texts\[1\]` must be a str, got int"):
        review_classifier.classify_texts(["fine", 3])
    with pytest.raises(TypeError, match="`texts` must be a list of str"):
        review_classifier.classify_texts("one review")


def test_bucketed_batches_have_static_widths_and_counted_steps(
        reviews, review_classifier):
    ids = encode_lowercase(review_classifier.tokenizer, reviews[0], MAX_LENGTH)
    lengths = ids.row_lengths().numpy()
    ds = labelled_bucket_batches(ids, reviews[1], 16, MAX_LENGTH,
                           drop_remainder=True)
    batches = list(ds)
    assert len(batches) == labelled_bucket_steps(lengths, 16, MAX_LENGTH)
    assert all(x.shape[0] == 16 and x.shape[1] in bucket_widths(MAX_LENGTH)
               for x, _ in batches)
    assert bucket_widths(320) == (64, 128, 192, 256, 320)
    assert bucket_widths(100) == (64, 100)


# --- MNIST bad input ------------------------------------------------------------


def test_mnist_bad_images_and_labels_name_the_argument(digits):
    (images, labels), validation, test = digits
    config = mnist.MnistConfig(epochs=1, jit_compile=False)
    cases = [
        ((images.astype("float32"), labels), TypeError,
         r"`train_images` must be uint8.*float32"),
        ((images[:, :27, :], labels), ValueError,
         r"`train_images` must have shape \(N, 28, 28\).*\(512, 27, 28\)"),
        ((images.reshape(512, 784), labels), ValueError, "train_images"),
        ((images, np.where(labels == 3, 10, labels)), ValueError,
         r"`train_labels` must be class ids in \[0, 10\), got "
         r"train_labels\[\d+\]=10"),
        ((images, labels.astype("int64") - 1), ValueError,
         r"train_labels\[\d+\]=-1"),
        ((images, labels.astype("float32")), TypeError,
         "`train_labels` must be integer class ids"),
        ((images, labels[:10]), ValueError,
         "`train_labels` has 10 entries, expected 512"),
    ]
    for train, error, message in cases:
        with pytest.raises(error, match=message):
            mnist.train_one("layer", 64, config, train, validation, test,
                            verbose=0)
    with pytest.raises(ValueError, match="`norm` must be one of"):
        mnist.train_one("group", 64, config, (images, labels), validation,
                        test)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(N,\)"):
        check_labels(labels.reshape(-1, 1), 10)


def test_digit_classifier_refuses_wrong_images(digit_run, digits):
    classifier, _, _ = digit_run
    images = digits[1][0][:4]
    with pytest.raises(TypeError, match=r"`images` must be uint8.*float64"):
        classifier.predict(images / 255.0)
    with pytest.raises(ValueError, match=r"images.shape=\(4, 28\)"):
        classifier.predict(images[:, 0, :])
    # The signature itself refuses other dtypes / shapes (served models).
    with pytest.raises((TypeError, ValueError)):
        classifier.classify(tf.constant(images, tf.float32))
    with pytest.raises((TypeError, ValueError)):
        classifier.classify(tf.zeros((4, 32, 32), tf.uint8))


# --- logging and reports --------------------------------------------------------


def test_batch_loss_is_the_loss_of_each_step(digits):
    """With a learning rate of 0 the weights stay fixed, so the logged loss
    of step k must equal the loss of batch k computed independently."""
    (images, labels), *_ = digits
    x, y = images[:96].astype("float32"), labels[:96].astype("int32")
    model = lenet_cnn("layer")
    model.compile(keras.optimizers.SGD(0.0), "sparse_categorical_crossentropy",
                  metrics=[BatchLoss()], jit_compile=False)
    log = StepLog()
    model.fit(x, y, batch_size=32, shuffle=False, epochs=1, callbacks=[log],
              verbose=0)
    probs = model.predict(x, verbose=0)
    expected = -np.log(probs[np.arange(96), y]).reshape(3, 32).mean(axis=1)
    np.testing.assert_allclose(log.steps, expected, rtol=1e-4)
    assert len(set(log.steps)) == 3      # not a running mean of one value
    assert log.epochs[0]["step"] == 3


def test_validation_split_is_seeded_and_disjoint():
    train, val = validation_split(1000, 0.1, seed=3)
    assert len(val) == 100 and len(train) == 900
    assert not set(train) & set(val) and set(train) | set(val) == set(range(1000))
    again, val_again = validation_split(1000, 0.1, seed=3)
    np.testing.assert_array_equal(val, val_again)
    assert not np.array_equal(val, validation_split(1000, 0.1, seed=4)[1])
    for bad in (0, 1.0, -0.1):
        with pytest.raises(ValueError, match="validation_fraction"):
            validation_split(1000, bad, seed=0)
    with pytest.raises(TypeError, match="validation_fraction=True"):
        validation_split(1000, True, seed=0)


def test_the_best_validation_epoch_is_restored(digits):
    """Three epochs with a learning rate that ruins the model after the first:
    the weights kept are those of the best validation epoch, and the test
    score is computed from them."""
    (images, labels), (vx, vy), _ = digits
    keras.utils.set_random_seed(0)
    model = lenet_cnn(None)
    rates = keras.optimizers.schedules.PiecewiseConstantDecay([8], [1e-3, 5.0])
    model.compile(keras.optimizers.Adam(rates), "sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    log, best = StepLog(), restore_best_epoch()
    log.on_train_batch_end = lambda batch, logs=None: None
    model.fit(images.astype("float32"), labels, batch_size=64, epochs=3,
              validation_data=(vx.astype("float32"), vy),
              callbacks=[log, best], verbose=0)
    accuracies = [e["val_accuracy"] for e in log.epochs]
    assert best.best_epoch == int(np.argmax(accuracies))
    assert max(accuracies) > min(accuracies) + 0.05   # the later epochs got worse
    kept = model.evaluate(vx.astype("float32"), vy, return_dict=True, verbose=0)
    assert kept["accuracy"] == pytest.approx(max(accuracies), abs=1e-6)


def test_mnist_report_and_plot(digit_run, tmp_path):
    _, result, config = digit_run
    assert result["steps"] == 8 and len(result["step_loss"]) == 8
    assert result["epoch_log"][0]["val_accuracy"] == result["validation_accuracy"]
    assert result["best_epoch"] == 1 and result["validation_examples"] == 200
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{result['run']}.json").write_text(json.dumps(result))
    report = mnist.write_report(tmp_path / "runs", tmp_path / "docs", config)
    text = report.read_text()
    assert f"{100 * result['test_accuracy']:.2f}%" in text
    png = tmp_path / "docs" / "mnist_batch_64.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 200_000
    compact = json.loads((tmp_path / "docs" / "lenet_batch_b64.json").read_text())
    assert "step_loss" not in compact
    assert compact["binned_step_loss"][-1]["step"] == 8


def test_mnist_findings_state_what_the_losses_show():
    def run(norm, b, last_loss, acc):
        return {"run": mnist.run_name(norm, b), "norm": norm, "batch_size": b,
                "label": mnist.NORM_LABELS[norm], "epochs": 2, "test_accuracy": acc,
                "step_loss": [1.0, 1.0, last_loss, last_loss]}

    results = {r["run"]: r for r in [
        run("batch", 128, 0.01, 0.990), run("layer", 128, 0.02, 0.991),
        run("none", 8, 0.01, 0.990), run("batch", 8, 0.05, 0.989),
        run("layer", 8, 0.005, 0.992)]}
    text = "\n".join(mnist._findings(results))
    assert "training loss 0.0100 vs 0.0200" in text
    assert "On training loss this matches \"BN >= LN" in text
    assert "on test accuracy it does not match" in text
    assert text.count("this matches") == 3      # BN at 128, BN hurts, LN helps
    assert "within 0.30 points" in text


def test_config_flags_parse_lists_and_bools():
    parser = config_parser("mnist", "MNIST.", mnist.MnistConfig, "runs/mnist")
    config, _ = parse_config(parser, mnist.MnistConfig, [
        "--batch-sizes", "32,4", "--jit-compile", "off", "--norms", "layer"])
    assert config.batch_sizes == (32, 4) and config.jit_compile is False
    assert config.norms == ("layer",) and config.epochs == 8


# --- both exports in a fresh process ---------------------------------------------


def test_exports_reload_in_fresh_process_without_keras_trm(
        review_classifier, digit_run, digits, tmp_path):
    digit_classifier, _, _ = digit_run
    text_path = export_module(
        review_classifier, tmp_path, "imdb_tiny",
        signatures={"serving_default": review_classifier.classify})
    digit_path = export_module(
        digit_classifier, tmp_path, "mnist_tiny",
        signatures={"serving_default": digit_classifier.classify})
    images = digits[2][0][:6]
    expected_text = review_classifier.classify_texts(REVIEWS)
    expected_digits = digit_classifier.predict(images)
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    request = {"reviews": REVIEWS, "images": images.tolist()}
    proc = subprocess.run(
        [sys.executable, str(script), str(text_path), str(digit_path)],
        input=json.dumps(request), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["text"], expected_text, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["digits"], expected_digits, rtol=1e-5,
                               atol=1e-6)


# --- the jobs end to end, as stages ------------------------------------------------


def test_imdb_job_runs_its_stages_in_order(review_vocab, data_dir, tmp_path):
    """``imdb.run`` on 200 reviews of each split, one tiny LSTM: the stages
    run in order and the result is what ``<kind>.json`` holds."""
    config = _tiny_imdb_config(models=("lstm",), limit=200)
    workdir = tmp_path / "work"
    workdir.mkdir()
    # The vocabulary the job would learn from its 180 training reviews.
    (workdir / f"vocab_lower_{config.vocabulary_size}_train180.txt").write_text(
        "\n".join(review_vocab) + "\n")
    result = imdb.run(config, data_dir, workdir, tmp_path / "export",
                      verbose=0)
    assert list(result["stage_seconds"]) == list(imdb.ImdbRun.STAGES)
    assert sorted(result) == ["lstm", "stage_seconds"]
    written = json.loads((workdir / "lstm.json").read_text())
    assert written == json.loads(json.dumps(result["lstm"]))
    assert result["lstm"]["test_examples"] == 200
    assert (tmp_path / "export" / "imdb_lstm").is_dir()
    assert (workdir / "results" / "report.md").is_file()


def test_mnist_job_runs_its_stages_in_order(data_dir, tmp_path, monkeypatch):
    """``mnist.run`` on 600 / 200 real digits, one run: the stages run in
    order and the result is what ``<run>.json`` holds."""
    load = mnist.load_mnist
    monkeypatch.setattr(mnist, "load_mnist", lambda split, *args, **kw: tuple(
        x[:600 if split == "train" else 200] for x in load(split, *args, **kw)))
    config = mnist.MnistConfig(norms=("layer",), batch_sizes=(64,), epochs=1,
                               jit_compile=False)
    workdir = tmp_path / "work"
    result = mnist.run(config, data_dir, workdir, tmp_path / "export",
                       verbose=0)
    assert list(result["stage_seconds"]) == list(mnist.MnistRun.STAGES)
    assert sorted(result) == ["lenet_layer_b64", "stage_seconds"]
    written = json.loads((workdir / "lenet_layer_b64.json").read_text())
    assert written == json.loads(json.dumps(result["lenet_layer_b64"]))
    assert result["lenet_layer_b64"]["train_examples"] == 540
    assert (tmp_path / "export" / "mnist_lenet_layer_b64").is_dir()
    assert (workdir / "results" / "report.md").is_file()
