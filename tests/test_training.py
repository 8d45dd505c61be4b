"""Noam schedule, label-smoothed loss, training on the prepared
translation batches (keras_trm.data.TokenBatches; its batching is tested
in test_prepared.py),
checkpoints, distribution."""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import fit_input, translation_batches
from keras_trm.training import (
    LabelSmoothedCrossEntropy,
    NoamSchedule,
    average_checkpoints,
    paper_adam,
    save_weights_atomic,
)

pytestmark = pytest.mark.portable  # CI runs it under each backend


def test_noam_values_at_chosen_steps():
    schedule = NoamSchedule(d_model=512, warmup_steps=4000)
    # lrate = 512^-0.5 * min(step^-0.5, step * 4000^-1.5), step counted from 1.
    for iteration, expected in [(0, 512**-0.5 * 1 * 4000**-1.5),
                                (999, 512**-0.5 * 1000 * 4000**-1.5),
                                (3999, 512**-0.5 * 4000**-0.5),
                                (99999, 512**-0.5 * 100000**-0.5)]:
        assert float(schedule(iteration)) == pytest.approx(expected, rel=1e-5)
    peak = float(schedule(3999))
    assert peak == pytest.approx(6.987712429686844e-4, rel=1e-5)
    assert float(schedule(3998)) < peak and float(schedule(4000)) < peak
    scaled = NoamSchedule(256, 400, scale=0.5)
    assert float(scaled(399)) == pytest.approx(0.5 * (256 * 400) ** -0.5, rel=1e-5)
    assert NoamSchedule(**schedule.get_config()).get_config() == schedule.get_config()


def test_paper_adam_settings():
    from keras_trm.training import FusedAdam

    opt = paper_adam(1e-3)
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(opt, FusedAdam)


def _adam_updates(optimizer, weights, grads_per_step):
    variables = [keras.Variable(w) for w in weights]

    @tf.function
    def step(grads):
        optimizer.apply_gradients(zip(grads, variables))

    for grads in grads_per_step:
        step(grads)
    return [v.numpy() for v in variables], step


@pytest.mark.tensorflow  # TensorFlow's fused Adam kernel
def test_fused_adam_matches_keras_adam_and_runs_one_kernel(rng):
    """Same trajectory as Keras' op-by-op Adam over 30 steps: to float
    rounding for dense gradients, which run as ResourceApplyAdam, exactly
    for a sparse (IndexedSlices) one, which falls back to Keras' update."""
    from keras_trm.training import FusedAdam

    weights = [rng.normal(size=s).astype("float32") for s in [(50, 40), (40,)]]
    steps = []
    for _ in range(30):
        rows = tf.constant(rng.integers(0, 50, size=6), tf.int64)
        steps.append([tf.IndexedSlices(
                          tf.constant(rng.normal(size=(6, 40)), tf.float32),
                          rows, tf.constant([50, 40], tf.int64)),
                      tf.constant(rng.normal(size=(40,)), tf.float32)])
    kw = dict(learning_rate=3e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    ours, step = _adam_updates(FusedAdam(**kw), weights, steps)
    keras_, _ = _adam_updates(keras.optimizers.Adam(**kw), weights, steps)
    for a, b, w in zip(ours, keras_, weights):
        assert np.abs(a - w).max() > 0.1            # the weights moved
    np.testing.assert_array_equal(ours[0], keras_[0])
    np.testing.assert_allclose(ours[1], keras_[1], rtol=0, atol=2e-6)
    dense = [[tf.convert_to_tensor(g) for g in grads] for grads in steps]
    ours, step = _adam_updates(FusedAdam(**kw), weights, dense)
    keras_, keras_step = _adam_updates(keras.optimizers.Adam(**kw), weights, dense)
    for a, b in zip(ours, keras_):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)
    def op_types(fn):
        graph = fn.get_concrete_function(dense[0]).graph
        types = {op.type for op in graph.get_operations()}
        for f in graph._functions.values():
            types |= {n.op for n in f.definition.node_def}
        return types

    assert "ResourceApplyAdam" in op_types(step)
    assert "ResourceApplyAdam" not in op_types(keras_step)
    # amsgrad has no fused kernel: Keras' own update, same result.
    ams = dict(kw, amsgrad=True)
    a, _ = _adam_updates(FusedAdam(**ams), weights, steps[:5])
    b, _ = _adam_updates(keras.optimizers.Adam(**ams), weights, steps[:5])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_fused_adam_saves_and_loads_with_the_model(tmp_path):
    from keras_trm.training import FusedAdam

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=paper_adam(NoamSchedule(8, 4)), loss="mse")
    x = np.ones((4, 3), "float32")
    model.fit(x, np.zeros((4, 2), "float32"), epochs=2, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, FusedAdam)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("bad", [dict(d_model=0), dict(warmup_steps=-5),
                                 dict(scale=0.0)])
def test_noam_bad_arguments(bad):
    with pytest.raises((ValueError, TypeError)):
        NoamSchedule(**{"d_model": 8, **bad})


def test_label_smoothed_loss_formula(rng):
    vocab, eps = 7, 0.1
    logits = rng.normal(size=(2, 4, vocab)).astype("float32")
    labels = np.array([[3, 1, 0, 0], [2, 6, 5, 0]], "int32")
    loss = float(LabelSmoothedCrossEntropy(eps)(labels, logits))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    total, count = 0.0, 0
    for b in range(2):
        for t in range(4):
            if labels[b, t] == 0:
                continue
            q = np.full(vocab, eps / vocab)
            q[labels[b, t]] += 1 - eps
            total += -(q * log_p[b, t]).sum()
            count += 1
    assert loss == pytest.approx(total / count, rel=1e-5)
    # Without smoothing it is the plain masked cross-entropy.
    plain = float(LabelSmoothedCrossEntropy(0.0)(labels, logits))
    ref = np.mean([-log_p[b, t, labels[b, t]] for b in range(2) for t in range(4)
                   if labels[b, t]])
    assert plain == pytest.approx(ref, rel=1e-5)


def test_loss_ignores_padding_and_never_nans(rng):
    loss_fn = LabelSmoothedCrossEntropy(0.1)
    logits = rng.normal(size=(1, 3, 5)).astype("float32")
    labels = np.array([[2, 0, 0]], "int32")
    changed = logits.copy()
    changed[0, 1:] = 1e4
    assert float(loss_fn(labels, logits)) == pytest.approx(float(loss_fn(labels, changed)))
    assert float(loss_fn(np.zeros((1, 3), "int32"), logits)) == 0.0
    with pytest.raises(ValueError, match="label_smoothing"):
        LabelSmoothedCrossEntropy(1.5)


def test_atomic_save_and_checkpoint_average(tmp_path, rng):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    paths = []
    values = []
    for i in range(3):
        weights = [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]
        model.set_weights(weights)
        values.append(weights)
        paths.append(save_weights_atomic(model, tmp_path / f"c{i}.weights.h5"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "c0.weights.h5", "c1.weights.h5", "c2.weights.h5"]  # no temp files left
    average_checkpoints(model, paths)
    for got, *each in zip(model.get_weights(), *values):
        np.testing.assert_allclose(got, np.mean(each, 0), atol=1e-6)
    with pytest.raises(ValueError, match="weights.h5"):
        save_weights_atomic(model, tmp_path / "x.h5")
    with pytest.raises(FileNotFoundError, match="missing"):
        average_checkpoints(model, [tmp_path / "missing.weights.h5"])


def test_training_lowers_the_loss_on_real_data(multi30k_small, tokenizer,
                                               tmp_path):
    from keras_trm.models import transformer

    src, tgt = multi30k_small
    batches, _ = translation_batches(tokenizer, (src[:600], tgt[:600]), tmp_path,
                                     1024, (16, 24, 32, 64, 128),
                                     max_train_length=128)
    ds, steps = fit_input(batches), batches.batches_per_epoch
    model = transformer(tokenizer.vocabulary_size, num_layers=1, d_model=32,
                        num_heads=2, d_ff=64, max_sequence_length=128)
    model.compile(optimizer=paper_adam(NoamSchedule(32, 30, scale=2.0)),
                  loss=LabelSmoothedCrossEntropy(0.1))
    # evaluate starts the stream again: epoch 0's batches both times
    first = model.evaluate(ds, steps=steps, verbose=0)
    model.fit(ds, epochs=4, steps_per_epoch=steps, verbose=0)
    last = model.evaluate(ds, steps=steps, verbose=0)
    assert last < first - 1.0, (first, last)


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from keras_trm.training import make_strategy, resolve_jit_compile
    strategy = make_strategy(sys.argv[1], num_cpu_devices=2)
    import keras, tensorflow as tf
    from keras_trm.models import transformer
    from keras_trm.training import LabelSmoothedCrossEntropy
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    src = rng.integers(1, 40, size=(8, 6)).astype("int32")
    tgt = rng.integers(1, 40, size=(8, 6)).astype("int32")
    tgt[:4, 1:] = 0   # replica 0 gets 4 real target tokens, replica 1 gets 24
    ds = tf.data.Dataset.from_tensors(
        ({"encoder_tokens": src, "decoder_tokens": tgt}, tgt))
    with strategy.scope():
        model = transformer(40, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                            dropout_rate=0.0, max_sequence_length=8)
        # SGD: its update is the gradient itself (Adam would hide a scale).
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=LabelSmoothedCrossEntropy(0.1),
                      jit_compile=resolve_jit_compile("auto", strategy))
    hist = model.fit(ds, epochs=3, verbose=0)
    print(json.dumps({"replicas": strategy.num_replicas_in_sync,
                      "jit": bool(resolve_jit_compile("auto", strategy)),
                      "loss": hist.history["loss"],
                      "w": np.concatenate([w.ravel() for w in
                                           model.get_weights()]).tolist()}))
""")


def test_mirrored_strategy_on_two_logical_cpus_matches_one_device(tmp_path):
    """Two replicas with very different token counts (4 and 24) train as one
    device does on the whole batch: the loss and its gradient are the mean
    over the global batch's real tokens, not the mean of the replicas' means
    (which gives another loss and other weights: checked on the old code)."""
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    results = {}
    for kind in ("default", "mirrored"):
        proc = subprocess.run([sys.executable, str(script), kind],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["mirrored"]["replicas"] == 2
    assert results["mirrored"]["jit"] is False and results["default"]["jit"] is True
    one, two = results["default"], results["mirrored"]
    assert one["loss"][-1] < one["loss"][0]
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(two["w"], one["w"], rtol=1e-4, atol=1e-5)


def test_checkpoint_average_is_chosen_by_the_score(tmp_path):
    """k = 1..max_count newest checkpoints are averaged and scored; the
    model ends with the best average (ties: the smaller k)."""
    from keras_trm.training import save_weights_atomic, select_checkpoint_average

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    paths = []
    for i, w in enumerate([10.0, 0.0, 4.0, 2.0]):     # oldest first
        model.set_weights([np.array([[w]], "float32")])
        paths.append(save_weights_atomic(model, tmp_path / f"e{i}.weights.h5"))
    # The score prefers a kernel close to 3: last 1 -> 2, last 2 -> 3,
    # last 3 -> 2, last 4 -> 4.
    def score(m):
        return -abs(float(m.get_weights()[0][0, 0]) - 3.0)

    k, scores = select_checkpoint_average(model, paths, score, max_count=4)
    assert k == 2 and sorted(scores) == [1, 2, 3, 4]
    assert scores[2] == 0.0 and scores[1] == scores[3] == -1.0
    assert float(model.get_weights()[0][0, 0]) == pytest.approx(3.0)
    k, scores = select_checkpoint_average(model, paths, score, max_count=1)
    assert k == 1 and float(model.get_weights()[0][0, 0]) == pytest.approx(2.0)
    # Ties go to the smaller k: last 1 and last 3 both give 2.
    k, _ = select_checkpoint_average(
        model, paths[1:], lambda m: -abs(float(m.get_weights()[0][0, 0]) - 2.0), 3)
    assert k == 1
    with pytest.raises(ValueError, match="paths"):
        select_checkpoint_average(model, [], score)


def _fit_under_budget(monkeypatch, seconds, epoch_seconds, epochs):
    """What fit() does with a ``TimeBudget`` on a fake clock: epoch ``e``
    takes ``epoch_seconds(e)``; stops when the callback says so. Returns
    (last epoch run, clock, budget)."""
    from keras_trm.training import monitoring

    clock = [0.0]
    monkeypatch.setattr(monitoring.time, "time", lambda: clock[0])
    budget = monitoring.TimeBudget(seconds=seconds)
    budget.set_model(keras.Sequential([keras.layers.Dense(1)]))
    budget.model.stop_training = False
    budget.on_train_begin()
    for epoch in range(epochs):
        budget.on_epoch_begin(epoch)
        clock[0] += epoch_seconds(epoch)
        budget.on_epoch_end(epoch)
        if budget.model.stop_training:
            break
    return epoch, clock[0], budget


def test_time_budget_stops_before_an_epoch_would_cross_it(monkeypatch):
    epoch, clock, budget = _fit_under_budget(monkeypatch, 100.0, lambda e: 30.0, 10)
    # after 60 s another 30-s epoch still fits (90 <= 100); after 90 it does not
    assert budget.model.stop_training is True
    assert epoch == 2 and clock == 90.0


def test_time_budget_does_not_judge_later_epochs_by_the_compiling_first(monkeypatch):
    """Under XLA the first epoch also compiles every batch shape (98 s on a
    GPU against seconds for the next): once a later epoch has run, it is the
    estimate, so a 200-s budget is not stopped after one epoch."""
    epoch, clock, budget = _fit_under_budget(
        monkeypatch, 200.0, lambda e: 98.0 if e == 0 else 5.0 + (e == 3), 100)
    # After 20 epochs: 98 + 19 x 5 + 1 = 194 s, and one more as long as the
    # longest later one (6 s) still fits (200); after 21 (199 s) it does not.
    assert clock == 98.0 + 5.0 * 20 + 1.0 and epoch == 20
    assert budget.get_state()["longest_epoch"] == 6.0


def test_time_budget_counts_training_time_across_a_restart(monkeypatch):
    """A resumed run starts with the time the killed one had trained (from
    the backup), not with a fresh budget; time while it was down is not
    counted."""
    from keras_trm.training import monitoring

    clock = [0.0]
    monkeypatch.setattr(monitoring.time, "time", lambda: clock[0])
    first = monitoring.TimeBudget(seconds=100.0)
    first.on_train_begin()
    first.on_epoch_begin(0)
    clock[0] += 40.0
    state = first.get_state()          # what TrainingBackup saves
    assert state["elapsed_seconds"] == 40.0
    clock[0] += 1000.0                 # the machine was down
    second = monitoring.TimeBudget(seconds=100.0)
    second.set_model(keras.Sequential([keras.layers.Dense(1)]))
    second.model.stop_training = False
    second.on_train_begin()
    second.set_state({"elapsed_seconds": 40.0, "longest_epoch": 30.0})
    second.on_epoch_begin(1)
    clock[0] += 30.0
    second.on_epoch_end(1)
    # 40 + 30 = 70 s trained; one more 30-s epoch would reach 100 -> fits
    assert second.elapsed() == 70.0 and not second.model.stop_training
    second.on_epoch_begin(2)
    clock[0] += 31.0
    second.on_epoch_end(2)
    assert second.model.stop_training


def test_gradient_accumulation_of_two_micro_batches_equals_one_batch(rng):
    """gradient_accumulation_steps=2 over micro-batches A then B makes the
    same update as one step on A+B (equal token counts, so the mean of the
    two means is the mean), with the Noam rate counted in updates.

    SGD, not the paper's Adam: with Adam's epsilon=1e-9 a near-zero gradient
    entry moves its weight by about +-lr whatever its size, so float
    round-off between the two sums (1e-9) shows up as lr-sized differences;
    SGD compares the averaged gradients themselves."""
    from keras_trm.models import transformer
    from keras_trm.training import (LabelSmoothedCrossEntropy, NoamSchedule,
                                    PerUpdateSchedule, accumulation_steps)

    assert accumulation_steps(25000, 4096, 3) == 3
    assert accumulation_steps(8192, 4096) == 2
    with pytest.raises(ValueError, match="tokens_per_batch"):
        accumulation_steps(25000, 0)
    enc = rng.integers(1, 30, (8, 6)).astype("int32")
    dec = rng.integers(1, 30, (8, 6)).astype("int32")
    lab = rng.integers(1, 30, (8, 6)).astype("int32")

    def run(accumulate):
        keras.utils.set_random_seed(3)
        model = transformer(30, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                            dropout_rate=0.0, max_sequence_length=8)
        init = model.get_weights()
        schedule = NoamSchedule(16, 4)
        if accumulate > 1:
            schedule = PerUpdateSchedule(schedule, accumulate)
        model.compile(optimizer=keras.optimizers.SGD(
            schedule, gradient_accumulation_steps=accumulate if accumulate > 1 else None),
            loss=LabelSmoothedCrossEntropy(0.1), jit_compile=False)
        batch = 8 // accumulate
        # 3 updates: 3 * accumulate micro-batches (data repeated).
        x = {"encoder_tokens": np.tile(enc, (3, 1)),
             "decoder_tokens": np.tile(dec, (3, 1))}
        model.fit(x, np.tile(lab, (3, 1)), batch_size=batch, shuffle=False,
                  verbose=0)
        lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        return model.get_weights(), int(keras.ops.convert_to_numpy(model.optimizer.iterations)), lr, init

    w1, updates1, lr1, init = run(1)
    w2, updates2, lr2, _ = run(2)
    assert updates1 == updates2 == 3
    assert lr2 == pytest.approx(lr1)        # the schedule is in updates
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(w1, w2))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(w1, init))
    print(f"accumulated vs one batch: max |dw| = {diff:.3g} (update {moved:.3g})")
    assert diff < 1e-5 and moved > 1e-3


def test_tensorboard_scalars_are_written(tmp_path):
    """loss, learning_rate, tokens_per_second (every N steps, step = the
    optimizer's micro-step) and the validation score (per epoch) land in
    event files that TensorBoard reads, without the tensorboard package."""
    import tensorflow as tf

    from keras_trm.training import (BleuLog, NoamSchedule, TensorBoardScalars,
                                    TokenCount, tensorboard_writer)

    model = keras.Sequential([keras.Input((4,), dtype="int32"),
                              keras.layers.Embedding(10, 5),
                              keras.layers.Dense(10)])
    model.compile(optimizer=paper_adam(NoamSchedule(8, 2)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[TokenCount()])
    writer = tensorboard_writer(tmp_path / "tb")
    x = np.tile(np.array([[1, 2, 3, 4]], "int32"), (12, 1))
    y = np.array([[1, 2, 0, 0]] * 12, "int32")   # 2 real tokens per row
    model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[
        TensorBoardScalars(writer, every=2),
        BleuLog(lambda m: 7.0, tmp_path / "log.json", writer=writer)])
    values = {}
    for path in (tmp_path / "tb").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                values.setdefault(v.tag, []).append(
                    (event.step, float(tf.make_ndarray(v.tensor))))
    assert set(values) == {"loss", "learning_rate", "tokens_per_second",
                           "val_greedy_bleu"}
    assert [s for s, _ in values["loss"]] == [2, 4, 6, 8, 10, 12]
    step, lr = values["learning_rate"][0]
    assert lr == pytest.approx(float(NoamSchedule(8, 2)(step)), rel=1e-5)
    assert all(rate > 0 for _, rate in values["tokens_per_second"])
    assert values["val_greedy_bleu"] == [(1, 7.0), (2, 7.0)]


@pytest.mark.parametrize("value,match", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ('{"task": {"type": "worker", "index": 0}}', 'TF_CONFIG has no "cluster"'),
    ('{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG cluster job 'worker'"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}}', 'TF_CONFIG needs "task"'),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}',
     "TF_CONFIG task type 'ps'"),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 1}}',
     "TF_CONFIG task index 1"),
])
def test_bad_tf_config_is_named(monkeypatch, value, match):
    from keras_trm.training import make_strategy, tf_config

    with pytest.raises(ValueError, match=match):
        tf_config(value)
    monkeypatch.setenv("TF_CONFIG", value)
    with pytest.raises(ValueError, match=match):
        make_strategy("multi_worker")
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="TF_CONFIG"):
        make_strategy("multi_worker")
