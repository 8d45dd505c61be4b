"""Bad input and bad backups are refused with an error that names the
argument or file, before training starts: ``TrainingBackup`` refuses a
backup of another run (fingerprint, optimizer, epoch length, weight
shapes) and a damaged one, and never overwrites it; the callbacks and
the distribution helpers check their arguments up front."""

import json
import shutil

import keras
import numpy as np
import pytest

from keras_trm.training import DataPosition, TrainingBackup
from keras_trm.training.monitoring import BleuLog, TimeBudget

pytestmark = pytest.mark.portable  # CI runs it under each backend


def _model(optimizer="adam", units=1):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(units)])
    model.compile(optimizer, "mse")
    return model


def _fit(model, backup, epochs=1):
    model.fit(np.ones((8, 2)), np.ones((8, model.output_shape[-1])),
              batch_size=2, epochs=epochs, callbacks=[backup], verbose=0)


def _backup(directory, **kwargs):
    kwargs.setdefault("steps_per_epoch", 4)
    return TrainingBackup(directory, save_freq=2, **kwargs)


def _files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


FP = {"source": "de", "target": "en", "vocab": 8000, "sizes": (1, 2)}


@pytest.fixture
def plain(tmp_path):
    """A complete backup of an adam run without fingerprint."""
    directory = tmp_path / "backup"
    _fit(_model(), _backup(directory))
    return directory


@pytest.fixture
def saved(tmp_path):
    """A complete backup of an adam run with fingerprint ``FP``."""
    directory = tmp_path / "backup"
    _fit(_model(), _backup(directory, fingerprint=FP))
    return directory


@pytest.mark.parametrize("change, expected", [
    (dict(fingerprint={**FP, "target": "fr"}), "target: 'en' -> 'fr'"),
    (dict(fingerprint={**FP, "extra": 1}), "extra: '(absent)' -> 1"),
    (dict(model=_model("sgd")), "optimizer: 'Adam' -> 'SGD'"),
    (dict(model=_model(units=2)), "weights do not fit this model"),
    (dict(steps_per_epoch=3), "steps_per_epoch: 4 -> 3"),
])
def test_backup_of_another_run_is_refused_and_kept(saved, change, expected):
    before = _files(saved)
    model = change.pop("model", None) or _model()
    kwargs = {"fingerprint": FP, **change}
    with pytest.raises(ValueError) as e:
        _fit(model, _backup(saved, **kwargs))
    message = str(e.value)
    assert str(saved) in message and expected in message, message
    assert "delete" in message
    assert _files(saved) == before  # the good backup is untouched


def test_same_fingerprint_resumes_and_tuples_compare_as_lists(saved):
    backup = _backup(saved, fingerprint=dict(FP))
    _fit(_model(), backup, epochs=2)
    assert backup.restored["epoch"] == 1
    state = json.loads((saved / "state.json").read_text())
    assert state["fingerprint"] == {**FP, "sizes": [1, 2]}
    assert state["optimizer"] == "Adam" and state["epoch"] == 2


def test_other_optimizer_refused_even_in_a_backup_that_did_not_record_it(saved):
    """A backup written before the optimizer was recorded: Keras would only
    warn and skip the optimizer's variables."""
    state = json.loads((saved / "state.json").read_text())
    for key in ("fingerprint", "optimizer", "steps_per_epoch",
                "batches_per_epoch", "num_workers"):
        del state[key]
    (saved / "state.json").write_text(json.dumps(state))
    before = _files(saved)
    with pytest.raises(ValueError, match="Skipping variable loading"):
        _fit(_model("sgd"), _backup(saved))
    assert _files(saved) == before


def test_old_backup_without_fingerprint(saved):
    state = json.loads((saved / "state.json").read_text())
    for key in ("fingerprint", "optimizer", "steps_per_epoch",
                "batches_per_epoch", "num_workers"):
        del state[key]
    (saved / "state.json").write_text(json.dumps(state))
    copy = saved.parent / "copy"
    shutil.copytree(saved, copy)
    # No fingerprint passed: resumes as before.
    backup = _backup(saved)
    _fit(_model(), backup, epochs=2)
    assert backup.restored["epoch"] == 1
    # One passed: resumes with a warning and records it from then on.
    backup = _backup(copy, fingerprint=FP)
    with pytest.warns(UserWarning, match="has no fingerprint"):
        _fit(_model(), backup, epochs=2)
    assert backup.restored["epoch"] == 1
    assert json.loads((copy / "state.json").read_text())["fingerprint"] == \
        {**FP, "sizes": [1, 2]}


def _damage_state(directory, edit):
    path = directory / "state.json"
    state = json.loads(path.read_text())
    new = edit(state)
    path.write_text(new if isinstance(new, str) else json.dumps(
        state if new is None else new))


DAMAGED_STATES = {
    "truncated": lambda s: json.dumps(s)[:20],
    "empty": lambda s: "",
    "list": lambda s: [1, 2],
    "no seed_states": lambda s: s.pop("seed_states") and None,
    "epoch string": lambda s: s.update(epoch="2"),
    "negative epoch": lambda s: s.update(epoch=-2),
    "huge epoch": lambda s: s.update(epoch=10 ** 9),
    "batch past the epoch": lambda s: s.update(batch=5, step=9),
    "weights path": lambda s: s.update(weights="../../../etc/passwd"),
    "weights missing": lambda s: s.update(weights="step_000000099.weights.h5"),
    "seed not numbers": lambda s: s.update(seed_states=[["a"]]),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_STATES))
def test_damaged_state_json_is_refused_naming_the_file(plain, case):
    _damage_state(plain, DAMAGED_STATES[case])
    before = _files(plain)
    with pytest.raises(ValueError) as e:
        _fit(_model(), _backup(plain))
    message = str(e.value)
    assert str(plain / "state.json") in message and "damaged" in message
    assert "delete" in message, message
    assert _files(plain) == before


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_weights_file_is_refused_naming_it(plain, damage):
    weights = plain / json.loads((plain / "state.json").read_text())["weights"]
    data = weights.read_bytes()
    weights.write_bytes(b"garbage" if damage == "garbage" else data[:500])
    with pytest.raises(ValueError) as e:
        _fit(_model(), _backup(plain))
    message = str(e.value)
    assert str(weights) in message and "damaged" in message, message


@pytest.mark.parametrize("name, state", [
    ("budget", {}), ("log", {}), ("budget", {"elapsed_seconds": "x",
                                             "longest_epoch": 0})])
def test_damaged_callback_state_is_refused_naming_the_file(plain, name, state):
    _damage_state(plain, lambda s: s["callbacks"].update({name: state}))
    stateful = {"budget": TimeBudget(60), "log": BleuLog(lambda m: 1.0,
                                                         plain.parent / "l.json")}
    with pytest.raises(ValueError) as e:
        _fit(_model(), _backup(plain, stateful=stateful))
    message = str(e.value)
    assert str(plain / "state.json") in message and repr(name) in message


def test_backup_dir_that_is_a_file_is_refused_at_construction(tmp_path):
    path = tmp_path / "backup"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match="backup_dir.*is a file"):
        TrainingBackup(path)
    with pytest.raises(ValueError, match="is a file"):
        TrainingBackup(path / "below")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(save_freq=True), ValueError, "save_freq"),
    (dict(save_freq=0), ValueError, "save_freq"),
    (dict(position=DataPosition(), steps_per_epoch=2, num_workers=0),
     ValueError, "num_workers"),
    (dict(position=DataPosition(), steps_per_epoch=-2), ValueError,
     "steps_per_epoch"),
    (dict(steps_per_epoch=2.5), TypeError, "steps_per_epoch"),
    (dict(batches_per_epoch=0), ValueError, "batches_per_epoch"),
    (dict(fingerprint=["a"]), TypeError, "fingerprint"),
    (dict(fingerprint={"a": object()}), TypeError, "fingerprint"),
    (dict(stateful={"x": object()}), TypeError, "stateful"),
])
def test_training_backup_arguments_checked(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        TrainingBackup(tmp_path / "b", **kwargs)


@pytest.mark.parametrize("every, error", [(0, ValueError), (-1, ValueError),
                                          (2.5, TypeError)])
def test_bleu_log_every_checked(tmp_path, every, error):
    with pytest.raises(error, match="every"):
        BleuLog(lambda m: 1.0, tmp_path / "log.json", every=every)


def test_bleu_log_score_must_be_callable(tmp_path):
    with pytest.raises(TypeError, match="score"):
        BleuLog(12.5, tmp_path / "log.json")


@pytest.mark.parametrize("seconds, error", [("abc", TypeError), ("60", TypeError),
                                            (0, ValueError), (float("nan"), ValueError)])
def test_time_budget_seconds_checked(seconds, error):
    with pytest.raises(error, match="seconds"):
        TimeBudget(seconds)


@pytest.mark.parametrize("state", [{}, [], {"elapsed_seconds": -1.0, "longest_epoch": 0.0},
                                   {"elapsed_seconds": "1", "longest_epoch": 0.0}])
def test_time_budget_damaged_state(state):
    with pytest.raises(ValueError, match="TimeBudget state"):
        TimeBudget(60).set_state(state)


@pytest.mark.parametrize("state", [{}, {"history": "x"}, {"history": [1]}])
def test_bleu_log_damaged_state(tmp_path, state):
    with pytest.raises(ValueError, match="BleuLog state"):
        BleuLog(lambda m: 1.0, tmp_path / "log.json").set_state(state)


@pytest.mark.parametrize("n, error", [(0, ValueError), (-1, ValueError),
                                      ("two", TypeError)])
def test_make_strategy_num_cpu_devices_checked_first(n, error):
    from keras_trm.training import make_strategy
    with pytest.raises(error, match="`num_cpu_devices` must be a positive int"):
        make_strategy("mirrored", num_cpu_devices=n)


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), ("on", True), ("off", False), ("auto", True)])
def test_resolve_jit_compile_choices(value, expected):
    import tensorflow as tf
    from keras_trm.training import resolve_jit_compile
    assert resolve_jit_compile(value, tf.distribute.get_strategy()) is expected
    assert resolve_jit_compile(value, None) is expected


@pytest.mark.parametrize("value", ["false", "true", "", 1, None, "AUTO"])
def test_resolve_jit_compile_refuses_other_values(value):
    import tensorflow as tf
    from keras_trm.training import resolve_jit_compile
    with pytest.raises(ValueError, match="jit_compile"):
        resolve_jit_compile(value, tf.distribute.get_strategy())


def test_shard_batches_needs_a_dataset():
    from keras_trm.training import shard_batches
    with pytest.raises(TypeError, match="dataset"):
        shard_batches([1, 2])
