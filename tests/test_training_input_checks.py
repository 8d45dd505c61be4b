"""Bad input to keras_trm.training and keras_trm.export: each refusal names
the argument and the value, and loses nothing (the model's weights, files
outside an export)."""

import numpy as np
import pytest
import keras

from keras_trm.training import (
    EpochCheckpoints,
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    NoamSchedule,
    PerUpdateSchedule,
    accumulation_steps,
    average_checkpoints,
    paper_adam,
    save_weights_atomic,
    select_checkpoint_average,
    warmup_cosine_decay,
)


pytestmark = pytest.mark.portable  # CI runs it under each backend


def _dense(units=1):
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(units)])


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def checkpoints(tmp_path):
    """a.weights.h5 (the model's architecture), wider.weights.h5 (another
    one), empty.weights.h5 (not an HDF5 file)."""
    save_weights_atomic(_dense(1), tmp_path / "a.weights.h5")
    save_weights_atomic(_dense(3), tmp_path / "wider.weights.h5")
    (tmp_path / "empty.weights.h5").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize("bad", ["wider.weights.h5", "empty.weights.h5"])
def test_average_checkpoints_names_the_bad_file_and_keeps_the_weights(checkpoints, bad):
    model = _dense(1)
    before = model.get_weights()
    with pytest.raises(ValueError, match=rf"`paths\[1\]`: checkpoint '.*{bad}'"):
        average_checkpoints(model, [checkpoints / "a.weights.h5", checkpoints / bad])
    assert _same(model.get_weights(), before)


def test_average_checkpoints_refuses_one_path_as_paths(checkpoints):
    with pytest.raises(TypeError, match="`paths` must be a list.*a.weights.h5"):
        average_checkpoints(_dense(1), str(checkpoints / "a.weights.h5"))


def test_select_checkpoint_average_never_chooses_a_nan_score(checkpoints):
    model = _dense(1)
    paths = [checkpoints / "a.weights.h5"] * 2
    scores = iter([float("nan"), 5.0])
    k, got = select_checkpoint_average(model, paths, lambda m: next(scores))
    assert k == 2 and np.isnan(got[1]) and got[2] == 5.0
    before = model.get_weights()
    with pytest.raises(ValueError, match="`score` gave NaN for every"):
        select_checkpoint_average(model, paths, lambda m: float("nan"))
    assert _same(model.get_weights(), before)
    with pytest.raises(TypeError, match="max_count=2.5"):
        select_checkpoint_average(model, paths, lambda m: 1.0, max_count=2.5)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"every_minutes": float("nan")}, ValueError, "every_minutes=nan"),
    ({"every_minutes": float("inf")}, ValueError, "every_minutes=inf"),
    ({"keep": 2.5}, TypeError, "keep=2.5"),
    ({"keep": True}, TypeError, "keep=True"),
    ({"every_steps": 1.5}, TypeError, "every_steps=1.5"),
])
def test_epoch_checkpoints_bad_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        EpochCheckpoints(tmp_path, **kwargs)


@pytest.mark.parametrize("call, error, match", [
    (lambda: paper_adam(-1.0), ValueError, "learning_rate=-1.0"),
    (lambda: paper_adam(float("nan")), ValueError, "learning_rate=nan"),
    (lambda: paper_adam("0.1"), TypeError, "learning_rate='0.1'"),
    (lambda: warmup_cosine_decay(1e-3, 10, 2, alpha=float("nan")), ValueError, "alpha=nan"),
    (lambda: warmup_cosine_decay(1e-3, 10, 2, alpha=-1.0), ValueError, "alpha=-1.0"),
    (lambda: warmup_cosine_decay(1e-3, 10, 2, alpha=2.0), ValueError, "alpha=2.0"),
    (lambda: warmup_cosine_decay(float("inf"), 10, 2), ValueError, "learning_rate=inf"),
    (lambda: NoamSchedule(16, scale=float("inf")), ValueError, "scale=inf"),
    (lambda: NoamSchedule(16, scale="x"), TypeError, "scale='x'"),
    (lambda: NoamSchedule(16, scale=None), TypeError, "scale=None"),
    (lambda: PerUpdateSchedule(NoamSchedule(16), 2.5), TypeError,
     "gradient_accumulation_steps=2.5"),
    (lambda: accumulation_steps(25000.5, 4096), TypeError, "tokens_per_step=25000.5"),
    (lambda: accumulation_steps(25000, 4096.9), TypeError, "tokens_per_batch=4096.9"),
    (lambda: accumulation_steps(25000, 4096, True), TypeError, "num_replicas=True"),
])
def test_rates_and_step_counts_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_paper_adam_still_takes_a_schedule_and_a_numpy_rate():
    schedule = NoamSchedule(16)
    assert paper_adam(schedule).learning_rate is not None
    assert float(paper_adam(np.float32(1e-3)).learning_rate) == pytest.approx(1e-3)


@pytest.fixture(scope="module")
def double():
    tf = pytest.importorskip("tensorflow")

    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": 2.0 * x}

    return Double()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"assets": {"../../evil.txt": "x"}}, ValueError, r"`assets` names.*\.\./\.\./evil"),
    ({"assets": {"/tmp/evil.txt": "x"}}, ValueError, "`assets` names.*/tmp/evil"),
    ({"assets": {"a.txt": b"x"}}, TypeError, r"`assets\['a.txt'\]` must be a str"),
    ({"version": -1}, ValueError, "version=-1"),
    ({"version": 2.5}, TypeError, "version=2.5"),
    ({"version": True}, TypeError, "version=True"),
    ({"signatures": None}, ValueError, "signatures=None"),
    ({"signatures": {}}, ValueError, "signatures={}"),
    ({"model_name": 5}, TypeError, "model_name=5"),
])
def test_export_module_refuses_before_writing_anything(double, tmp_path, kwargs, error, match):
    from keras_trm.export import export_module

    args = {"model_name": "double", "signatures": {"serving_default": double.serve},
            **kwargs}
    with pytest.raises(error, match=match):
        export_module(double, tmp_path / "export", **args)
    assert not any(tmp_path.rglob("*"))  # not even export/<model_name>/


def test_export_module_version_0_and_an_asset_in_a_subfolder(double, tmp_path):
    from keras_trm.export import export_module

    path = export_module(double, tmp_path, "double", {"serving_default": double.serve},
                         version=0, assets={"sub/a.txt": "x"})
    assert path.name == "0"
    assert (path / "assets.extra" / "sub" / "a.txt").read_text() == "x"


LOGITS = np.zeros((2, 3, 5), "float32")


@pytest.mark.parametrize("labels, error, match", [
    (np.full((2, 3), 1.7, "float32"), TypeError, "`y_true` must be integer labels.*float32"),
    (np.zeros((2, 4), "int32"), ValueError, r"`y_true` must be \(batch, T\).*\(2, 4\)"),
    (np.zeros((2, 3, 1), "int32"), ValueError, r"`y_true` must be \(batch, T\).*\(2, 3, 1\)"),
    ([[1, 9, 0], [1, 1, 1]], ValueError, r"`y_true` holds label 9, outside \[0, 5\)"),
    ([[1.5, 1, 0], [1, 1, 1]], TypeError, "`y_true` must be integer labels"),
])
def test_loss_refuses_bad_labels(labels, error, match):
    with pytest.raises(error, match=match):
        LabelSmoothedCrossEntropy(0.1)(labels, LOGITS)


def test_loss_refuses_2d_logits_and_bad_pad_ids():
    loss = LabelSmoothedCrossEntropy(0.1)
    with pytest.raises(ValueError, match=r"y_pred of shape \(2, 5\)"):
        loss(np.zeros((2,), "int32"), np.zeros((2, 5), "float32"))
    for cls in (LabelSmoothedCrossEntropy, MaskedAccuracy):
        with pytest.raises(TypeError, match="pad_id=1.7"):
            cls(pad_id=1.7)
        with pytest.raises(TypeError, match="pad_id='x'"):
            cls(pad_id="x")
        with pytest.raises(ValueError, match="pad_id=-1"):
            cls(pad_id=-1)
    with pytest.raises(TypeError, match="`y_true` must be integer labels"):
        MaskedAccuracy().update_state(np.full((2, 3), 1.7, "float32"), LOGITS)
    # A list of ids is as good as an array (same value).
    labels = [[1, 2, 0], [3, 4, 4]]
    assert float(loss(labels, LOGITS)) == float(loss(np.array(labels), LOGITS))


def test_loss_and_accuracy_in_fit_check_the_labels_dtype():
    """In ``fit`` the labels are tensors: int ids train, float ones are
    refused by their static dtype."""
    from keras_trm.models import transformer

    model = transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                        max_sequence_length=8)
    model.compile("sgd", loss=LabelSmoothedCrossEntropy(0.1),
                  metrics=[MaskedAccuracy()])
    ids = np.ones((2, 4), "int32")
    inputs = {"encoder_tokens": ids, "decoder_tokens": ids}
    model.fit(inputs, ids, epochs=1, verbose=0)
    with pytest.raises(TypeError, match="`y_true` must be integer labels"):
        model.fit(inputs, ids.astype("float32"), epochs=1, verbose=0)


def test_failed_average_keeps_the_optimizer_state(checkpoints, tmp_path):
    """load_weights also sets the optimizer's variables from a checkpoint
    that has them: a failed average puts those back too."""
    model = _dense(1)
    model.compile("adam", "mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    save_weights_atomic(model, tmp_path / "b.weights.h5")  # with Adam's m, v
    model.fit(np.ones((4, 2)), np.zeros((4, 1)), verbose=0)
    before = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    weights = model.get_weights()
    with pytest.raises(ValueError, match="wider.weights.h5"):
        average_checkpoints(model, [tmp_path / "b.weights.h5",
                                    checkpoints / "wider.weights.h5"])
    assert _same(model.get_weights(), weights)
    assert _same([keras.ops.convert_to_numpy(v) for v in model.optimizer.variables], before)
