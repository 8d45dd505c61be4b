"""Training a language model on ordered segments, on every backend:
``make_train_step`` (TensorFlow's tape, ``jax.jit`` of the stateless
calls, PyTorch's autograd) against Keras' own ``train_on_batch``, global
norm clipping, dropout draws that move on from step to step, a schedule
changed while training; ``train_segments``' time budget and its resume
after a kill; loss going down on Tiny Shakespeare."""

import json

import keras
import numpy as np
import pytest

from conftest import assert_allclose
from keras_trm.data import language_modeling as lm
from keras_trm.decoding import evaluate_with_memory
from keras_trm.jobs import language_model as job
from keras_trm.models import TransformerXLLM, vanilla_transformer_lm
from keras_trm.training import make_train_step
from keras_trm.training.language_model import train_batches

pytestmark = pytest.mark.portable  # CI runs it under each backend


def _vanilla(seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    return vanilla_transformer_lm(23, num_layers=1, d_model=16, num_heads=2,
                                  d_ff=32, max_sequence_length=8, **kwargs)


def _ids(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 23, shape).astype("int32")


def test_a_step_equals_keras_train_on_batch():
    """Three SGD steps of ``make_train_step`` give the weights and losses
    of Keras' own trainer for this backend (``compile`` + ``train_on_batch``)
    on the same model and segments: the gradient and the update are right."""
    ours, reference = _vanilla(dropout_rate=0.0), _vanilla(dropout_rate=0.0)
    reference.set_weights(ours.get_weights())
    step = make_train_step(ours, keras.optimizers.SGD(0.5), clip_norm=None)
    reference.compile(keras.optimizers.SGD(0.5), keras.losses.
                      SparseCategoricalCrossentropy(from_logits=True))
    for k in range(3):
        inputs, targets = _ids((4, 8), k), _ids((4, 8), 10 + k)
        loss, memories = step(inputs, targets)
        expected = reference.train_on_batch(inputs, targets)
        assert memories is None
        assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        assert_allclose(a, b, atol=2e-6)


def test_gradients_are_clipped_to_the_global_norm():
    """SGD(1) with ``clip_norm`` 1e-3 moves the weights by a vector of
    norm 1e-3 exactly; without clipping by far more."""
    moves = {}
    for clip_norm in (1e-3, None):
        model = _vanilla(dropout_rate=0.0)
        before = model.get_weights()
        make_train_step(model, keras.optimizers.SGD(1.0), clip_norm)(
            _ids((4, 8)), _ids((4, 8), 1))
        moves[clip_norm] = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in
                                       zip(model.get_weights(), before)))
    assert moves[1e-3] == pytest.approx(1e-3, rel=1e-3)
    assert moves[None] > 0.1


def test_dropout_draws_move_on_from_step_to_step():
    """With dropout and a zero learning rate two steps on the same segment
    see different masks (the seed generators' state is carried out of the
    compiled step), and the weights stay."""
    model = _vanilla(dropout_rate=0.5)
    before = model.get_weights()
    step = make_train_step(model, keras.optimizers.SGD(0.0))
    inputs, targets = _ids((4, 8)), _ids((4, 8), 1)
    first, second = (float(step(inputs, targets)[0]) for _ in range(2))
    assert first != second
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_a_schedule_changed_while_training_takes_effect():
    """The LM job's budget fit moves the decay's end after the step is
    compiled: with the end moved to the current step the rate is 0 and
    SGD leaves the weights as they are; before, they moved."""
    config = job.LanguageModelConfig(steps=1000, warmup_steps=1,
                                     learning_rate=0.1)
    schedule = job.cosine_warmup_schedule(config)
    model = _vanilla()
    optimizer = keras.optimizers.SGD(0.0)
    step = make_train_step(model, optimizer, schedule=schedule)
    inputs, targets = _ids((4, 8)), _ids((4, 8), 1)
    step(inputs, targets)  # step 0: warm-up from 0
    before = model.get_weights()
    step(inputs, targets)  # step 1: the peak
    assert float(optimizer.learning_rate) == pytest.approx(0.1)
    assert max(np.abs(a - b).max() for a, b in
               zip(model.get_weights(), before)) > 1e-4
    job.fit_schedule(schedule, 2)  # the decay now ends at step 2
    before = model.get_weights()
    step(inputs, targets)
    assert float(optimizer.learning_rate) == 0.0
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="float learning_rate"):
        make_train_step(_vanilla(), keras.optimizers.SGD(schedule),
                        schedule=schedule)


def test_cosine_warmup_schedule():
    config = job.LanguageModelConfig(steps=100, warmup_steps=10,
                                     learning_rate=1e-3,
                                     min_learning_rate_ratio=0.1)
    schedule = job.cosine_warmup_schedule(config)
    lr = np.array([float(schedule(s)) for s in range(0, 101)])
    assert lr[0] == 0.0 and lr[10] == pytest.approx(1e-3)
    assert np.all(np.diff(lr[:11]) > 0) and np.all(np.diff(lr[10:]) < 0)
    assert lr[100] == pytest.approx(1e-4)


def test_a_run_shorter_than_its_warmup_warns_once():
    """A budget that holds no more steps than the warm-up never reaches
    the peak rate: said once, however often the pace refits."""
    import warnings

    schedule = job.cosine_warmup_schedule(
        job.LanguageModelConfig(steps=1000, warmup_steps=400))
    with pytest.warns(UserWarning, match=r"holds 300 steps, no more than "
                      r"warmup_steps=400.*--training.warmup_steps"):
        job.fit_schedule(schedule, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        job.fit_schedule(schedule, 290)  # not again
        job.fit_schedule(job.cosine_warmup_schedule(
            job.LanguageModelConfig(steps=1000, warmup_steps=400)), 401)


def test_time_budget_fits_the_steps_to_the_measured_pace(monkeypatch):
    """A fake clock: a training step takes 2 s, a validation 50 s (not
    counted). A 300 s budget holds 150 of the 1000 planned steps."""
    from keras_trm.training import language_model as training

    class Clock:
        now = 0.0

        @classmethod
        def time(cls):
            return cls.now

    def step(inputs, targets, memories):
        Clock.now += 2.0
        return 1.0, None

    def evaluate():
        Clock.now += 50.0
        return 1.0

    fitted = []
    monkeypatch.setattr(training, "time", Clock)
    history, train_s, eval_s = training.train_segments(
        "fake", step, object(), np.arange(400).reshape(2, 200), 8, 1000, 40,
        evaluate, verbose=0, budget_seconds=300, on_fit=fitted.append)
    assert fitted == [150]
    assert history["step"] == [40, 80, 120, 150]
    assert train_s == 300 and eval_s == 200


class _Stop(Exception):
    """Stands for ``kill -9`` in the resume tests."""


def _train_tiny_xl(directory, stop_at=None):
    """12 steps of a 1-layer Transformer-XL (dropout 0.2) over streams of
    6 segments a pass, validated every 4 steps, with a checkpoint in
    ``directory``; ``stop_at``: the step call that raises ``_Stop``."""
    from keras_trm.training.language_model import (SegmentCheckpoint,
                                                   make_train_step,
                                                   train_segments)

    keras.utils.set_random_seed(0)
    model = TransformerXLLM(20, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                            mem_len=4, max_segment_len=4, dropout_rate=0.2)
    optimizer = keras.optimizers.Adam(1e-2)
    step = make_train_step(model, optimizer)
    calls = []

    def counted(inputs, targets, memories):
        calls.append(1)
        if len(calls) == stop_at:
            raise _Stop
        return step(inputs, targets, memories)

    checkpoint = SegmentCheckpoint(directory, model, optimizer, {"seed": 0})
    streams = np.random.default_rng(0).integers(0, 20, (2, 25)).astype("int32")
    history, _, _ = train_segments(
        "xl", counted, model, streams, 4, 12, 4,
        lambda: float(np.sum(model.get_weights()[0])), verbose=0,
        checkpoint=checkpoint)
    return model.get_weights(), history, calls


def test_a_resumed_run_ends_as_one_never_stopped(tmp_path):
    """Stopped at step 7 (after the checkpoint of step 4's validation) and
    started again, the run goes on from step 4 with the same batches,
    memories, dropout draws and optimizer state, and ends with the weights
    and history of a run never stopped; a file of other settings is
    refused by name."""
    from keras_trm.training.language_model import SegmentCheckpoint

    weights, history, _ = _train_tiny_xl(tmp_path / "whole")
    with pytest.raises(_Stop):
        _train_tiny_xl(tmp_path / "stopped", stop_at=7)
    resumed, resumed_history, calls = _train_tiny_xl(tmp_path / "stopped")
    assert len(calls) == 8  # steps 5 to 12 (5 and 6 on step 4's memories)
    assert resumed_history.pop("seconds") and history.pop("seconds")  # timing
    assert resumed_history == history
    for a, b in zip(weights, resumed):
        np.testing.assert_array_equal(a, b)
    model = TransformerXLLM(20, num_layers=1, d_model=8, num_heads=2, d_ff=16,
                            mem_len=4, max_segment_len=4)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    with pytest.raises(ValueError, match=r"another run \(seed=0 there, seed=1"):
        SegmentCheckpoint(tmp_path / "stopped", model, optimizer,
                          {"seed": 1}).restore()


def test_a_resumed_budget_run_keeps_its_fitted_steps(monkeypatch, tmp_path):
    """The fake clock of the budget test, stopped at step 100: started
    again, the run is told its fitted 150 steps at once and ends as the
    run never stopped did (validations at 40, 80, 120, 150; 300 s)."""
    from keras_trm.training import language_model as training

    class Clock:
        now = 0.0

        @classmethod
        def time(cls):
            return cls.now

    class Memo:  # the checkpoint's interface, in memory
        path, saved = "memo", None

        def save(self, state, memories):
            self.saved = json.loads(json.dumps(state))

        def restore(self):
            return None if self.saved is None else (self.saved, None)

    def step(inputs, targets, memories):
        if stop[0] and Clock.now >= 200:
            raise _Stop
        Clock.now += 2.0
        return 1.0, None

    monkeypatch.setattr(training, "time", Clock)
    memo, stop, fitted = Memo(), [True], []
    streams = np.arange(400).reshape(2, 200)
    with pytest.raises(_Stop):
        training.train_segments("fake", step, object(), streams, 8, 1000, 40,
                                lambda: 1.0, verbose=0, budget_seconds=300,
                                on_fit=fitted.append, checkpoint=memo)
    assert fitted == [150] and memo.saved["step"] == 80
    stop[0] = False
    history, train_s, _ = training.train_segments(
        "fake", step, object(), streams, 8, 1000, 40, lambda: 1.0, verbose=0,
        budget_seconds=300, on_fit=fitted.append, checkpoint=memo)
    assert fitted == [150, 150]
    assert history["step"] == [40, 80, 120, 150] and train_s == 300


def test_training_batches_reset_memories_only_at_a_new_pass():
    streams = np.arange(2 * 20).reshape(2, 20)
    batches = train_batches(streams, 6)
    flags, firsts = [], []
    for _ in range(7):  # 3 full segments per pass (19 targets // 6)
        inputs, targets, new_pass = next(batches)
        np.testing.assert_array_equal(targets, inputs + 1)
        flags.append(new_pass)
        firsts.append(int(inputs[0, 0]))
    assert flags == [True, False, False, True, False, False, True]
    assert firsts == [0, 6, 12, 0, 6, 12, 0]  # consecutive, then a new pass


def test_training_lowers_loss_on_tiny_shakespeare():
    keras.utils.set_random_seed(0)
    ids, vocab = lm.load_lm_corpus("tinyshakespeare", "train")
    streams = lm.batchify(ids[:200_000], 16)
    model = TransformerXLLM(
        len(vocab), num_layers=2, d_model=32, num_heads=4, d_ff=64,
        mem_len=32, max_segment_len=32, dropout_rate=0.0,
    )
    valid_ids, _ = lm.load_lm_corpus("tinyshakespeare", "valid", vocab)
    valid = lm.batchify(valid_ids[:4_000], 8)
    before = evaluate_with_memory(model, valid, 32, max_segments=4)
    step = make_train_step(model, keras.optimizers.Adam(3e-3), clip_norm=1.0)
    mems, losses = model.init_memories(16), []
    for k, (inputs, targets) in enumerate(lm.segments(streams, 32)):
        if k == 60:
            break
        loss, mems = step(inputs, targets, mems)
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5
    after = evaluate_with_memory(model, valid, 32, max_segments=4)
    assert after < before - 0.5
