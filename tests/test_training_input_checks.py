"""Bad input to keras_trm.training and keras_trm.export: each refusal names
the argument and the value, and loses nothing (the model's weights, files
outside an export)."""

import numpy as np
import pytest
import keras

from keras_trm.training import (
    EpochCheckpoints,
    average_checkpoints,
    save_weights_atomic,
    select_checkpoint_average,
)


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
