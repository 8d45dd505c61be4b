"""A time budget that cuts a run short fits its schedule (issue #63):
``BudgetDecay`` decays the learning rate linearly to 0 at the last epoch the
budget holds, ``TimeBudget`` fits it from the measured epoch times and stops
there, the compiled step uses the fitted rate, and a restored state keeps
it. Backend-independent (run under TensorFlow, JAX and PyTorch in CI)."""

import time

import keras
import numpy as np
import pytest

from keras_trm.training import BudgetDecay, NoamSchedule, TimeBudget


pytestmark = pytest.mark.portable  # CI runs it under each backend


def test_budget_decay_is_the_schedule_until_fitted_then_linear_to_zero():
    noam = NoamSchedule(16, 10, 0.5)
    decay = BudgetDecay(noam)
    steps = np.arange(0, 80)
    plain = [float(noam(s)) for s in steps]
    assert [float(decay(s)) for s in steps] == plain  # the same function, exactly
    decay.fit(start=20, end=60)
    factor = np.clip((60 - steps) / 40.0, 0.0, 1.0)
    np.testing.assert_allclose([float(decay(s)) for s in steps], plain * factor,
                               rtol=1e-6, atol=0)
    assert float(decay(60)) == 0.0 and float(decay(79)) == 0.0
    again = BudgetDecay.from_config(decay.get_config())
    assert (again.start, again.end) == (20, 60)
    np.testing.assert_allclose([float(again(s)) for s in steps],
                               [float(decay(s)) for s in steps], rtol=0, atol=0)


@pytest.mark.parametrize("start, end, error, match", [
    (-1, 10, ValueError, "start"), (10, 10, ValueError, "end=10"),
    (5.5, 10, TypeError, "start"), (0, "9", TypeError, "end"),
])
def test_budget_decay_bad_fit_is_named(start, end, error, match):
    with pytest.raises(error, match=match):
        BudgetDecay(lambda step: 1.0).fit(start, end)


class Constant(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.1


def _model(schedule):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    return model


def _budgeted(monkeypatch, seconds, epoch_seconds, epochs, steps_per_epoch=4):
    """TimeBudget(schedule=BudgetDecay) through the callback calls of a fit,
    on a fake clock: epoch ``e`` takes ``epoch_seconds(e)``. Returns (epochs
    run, budget, schedule, train functions made)."""
    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    schedule = BudgetDecay(lambda step: 1.0)
    budget = TimeBudget(seconds, schedule=schedule, steps_per_epoch=steps_per_epoch,
                        epochs=epochs)
    model = _model(schedule)
    made = []
    model.make_train_function = lambda force=False: made.append(force)
    budget.set_model(model)
    model.stop_training = False
    budget.on_train_begin()
    run = 0
    for epoch in range(epochs):
        budget.on_epoch_begin(epoch)
        clock[0] += epoch_seconds(epoch)
        budget.on_epoch_end(epoch)
        run += 1
        if model.stop_training:
            break
    return run, budget, schedule, made


def test_budget_fits_the_schedule_to_the_epochs_it_holds(monkeypatch):
    # 30-s epochs, 100 s: after the first (30 s) two more fit (90 s), not three.
    run, budget, schedule, made = _budgeted(monkeypatch, 100.0, lambda e: 30.0, 10)
    assert (schedule.start, schedule.end) == (4, 12)  # from epoch 1's end to epoch 3's
    assert run == 3 and made == [True]  # stopped at the fitted end; one new step
    state = budget.get_state()
    assert (state["decay_start"], state["decay_end"]) == (4, 12)


def test_a_run_whose_epochs_all_fit_keeps_its_schedule(monkeypatch):
    run, _, schedule, made = _budgeted(monkeypatch, 1000.0, lambda e: 30.0, 10)
    assert run == 10 and schedule.end == 0 and made == []


def test_the_fit_follows_the_estimate_past_the_compiling_epoch(monkeypatch):
    """The first epoch compiles (98 s); fitted on it, 2 more of 300 s fit;
    the second (5 s) moves the end later; the start stays where the decay
    began."""
    run, _, schedule, made = _budgeted(
        monkeypatch, 300.0, lambda e: 98.0 if e == 0 else 5.0, 100)
    # after epoch 2 (103 s): 197 s left hold 39 more 5-s epochs: 41 in all
    assert (schedule.start, schedule.end) == (4, 41 * 4)
    assert run == 41 and made == [True, True]


def test_a_restored_budget_keeps_the_fitted_schedule():
    schedule = BudgetDecay(lambda step: 1.0)
    budget = TimeBudget(600.0, schedule=schedule, steps_per_epoch=4, epochs=10)
    model = _model(schedule)
    budget.set_model(model)
    made = []
    model.make_train_function = lambda force=False: made.append(force)
    budget.set_state({"elapsed_seconds": 300.0, "longest_epoch": 30.0,
                      "decay_start": 8, "decay_end": 40})
    assert (schedule.start, schedule.end) == (8, 40) and made == [True]
    with pytest.raises(ValueError, match="fitted decay"):
        budget.set_state({"elapsed_seconds": 1.0, "longest_epoch": 1.0,
                          "decay_start": 50, "decay_end": 40})
    # a state from before the fit existed restores as unfitted
    other = BudgetDecay(lambda step: 1.0)
    TimeBudget(60.0, schedule=other, steps_per_epoch=4, epochs=10).set_state(
        {"elapsed_seconds": 1.0, "longest_epoch": 1.0})
    assert other.end == 0


def test_time_budget_schedule_arguments_are_checked():
    with pytest.raises(TypeError, match="schedule"):
        TimeBudget(60.0, schedule=NoamSchedule(8, 4), steps_per_epoch=4, epochs=2)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        TimeBudget(60.0, schedule=BudgetDecay(lambda s: 1.0), steps_per_epoch=0,
                   epochs=2)


def test_the_compiled_step_uses_the_refitted_rate(monkeypatch):
    """A fit whose schedule TimeBudget fits after its first epoch ends with
    the weights of a fit that had the same decay from the start: the train
    function made again reads the new rate (the old one would have kept
    training at the undecayed rate)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = rng.normal(size=(32, 2)).astype("float32")

    class SlowEpochs(keras.callbacks.Callback):  # each epoch "takes" 40 s
        def on_epoch_end(self, epoch, logs=None):
            clock[0] += 40.0

    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    schedule = BudgetDecay(Constant())
    budget = TimeBudget(100.0, schedule=schedule, steps_per_epoch=4, epochs=3)
    keras.utils.set_random_seed(1)
    model = _model(schedule)
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
              callbacks=[SlowEpochs(), budget])
    # 40 s per epoch in 100 s: two epochs; the decay runs over the second
    assert (schedule.start, schedule.end) == (4, 8)
    fitted = model.get_weights()
    keras.utils.set_random_seed(1)
    reference = _model(BudgetDecay(Constant(), start=4, end=8))
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(fitted, reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    keras.utils.set_random_seed(1)
    undecayed = _model(0.1)
    undecayed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert not np.allclose(fitted[0], undecayed.get_weights()[0], atol=1e-6)
