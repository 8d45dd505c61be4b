"""Training of language models on ordered segments (Dai et al. 2019 §3.2):
``make_train_step`` (one compiled optimizer step, memories carried from
segment to segment), ``train_segments`` (the loop over ``batchify``-ed
streams, with validation) and ``SegmentCheckpoint`` (resume after
``kill -9`` with the same weights, seeds, memories and data position).
"""

import io
import json
import math
import pathlib
import time

import keras
import numpy as np
from keras import ops

from keras_trm.data.language_modeling import segments
from keras_trm.utils.files import atomic_file


def lm_loss(targets, logits):
    """Mean next-token NLL (nats) of float logits ``(batch, T, V)`` against
    int ``targets (batch, T)``; computed in float32.

    Example:
    >>> import numpy as np
    >>> logits = np.zeros((1, 2, 4), "float32")
    >>> round(float(lm_loss(np.array([[0, 3]]), logits)), 4)  # ln 4
    1.3863
    """
    return ops.mean(ops.sparse_categorical_crossentropy(
        targets, ops.cast(logits, "float32"), from_logits=True))


def make_train_step(model, optimizer, clip_norm=0.25, schedule=None):
    """A compiled language-model training step, on every backend.

    ``step(inputs, targets, memories=None) -> (loss, new_memories)``: one
    optimizer update on the mean NLL of a segment (int32 ``(batch, T)``
    inputs and targets) plus the model's own losses (regularizers),
    gradients clipped to global norm ``clip_norm`` (0.25 in the reference
    PTB/WT103 setups; None = no clipping). Compiled as a ``tf.function``,
    a ``jax.jit`` of ``stateless_call``/``stateless_apply``, or PyTorch's
    eager autograd.

    For a model with ``init_memories`` (``TransformerXLLM``) start with
    ``memories = model.init_memories(batch)`` and pass each step's
    ``new_memories`` to the next segment of the same streams; for a
    memory-less model (``model(inputs)`` -> logits) leave ``memories``
    None (``new_memories`` is then None).

    Args:
        schedule: None (the optimizer's learning rate as it is) or a
            callable step -> rate, evaluated on the host before each step
            at the optimizer's ``iterations`` and written to its float
            learning-rate variable, so that a schedule changed during
            training takes effect at the next step on every backend (one
            inside the optimizer would keep, under ``jax.jit``, the values
            it was traced with).

    Raises:
        ValueError: ``schedule`` given while the optimizer's own
            learning rate is a schedule.

    Example:
    >>> import keras, numpy as np
    >>> from keras_trm.models import TransformerXLLM
    >>> model = TransformerXLLM(11, num_layers=1, d_model=8, num_heads=2,
    ...                         d_ff=16, mem_len=4, max_segment_len=4)
    >>> step = make_train_step(model, keras.optimizers.Adam(1e-3))
    >>> ids = np.ones((2, 4), "int32")
    >>> loss, memories = step(ids, ids, model.init_memories(2))
    >>> tuple(memories[0].shape)
    (2, 4, 8)
    """
    optimizer.build(model.trainable_variables)
    if schedule is not None and not isinstance(
            optimizer.learning_rate, keras.Variable):
        raise ValueError(
            "`schedule` needs an optimizer made with a float learning_rate, "
            f"got {type(optimizer).__name__} whose learning rate is itself a "
            "schedule")
    forward = _forward(model)
    update = {"tensorflow": _tensorflow_update, "jax": _jax_update,
              "torch": _torch_update}[keras.backend.backend()](
                  model, optimizer, forward, clip_norm)

    def step(inputs, targets, memories=None):
        if schedule is not None:
            iterations = int(ops.convert_to_numpy(optimizer.iterations))
            optimizer.learning_rate.assign(
                ops.convert_to_numpy(schedule(iterations)))
        return update(inputs, targets, memories)

    return step


def _forward(model):
    """``forward(call, inputs, targets, memories) -> (loss, new_memories)``,
    ``call(*args)`` running the model in training mode."""
    carries_memory = hasattr(model, "init_memories")

    def forward(call, inputs, targets, memories):
        if carries_memory:
            logits, new_memories = call(inputs, memories)
        else:
            logits, new_memories = call(inputs), None
        return lm_loss(targets, logits), new_memories

    return forward


def _clip_by_global_norm(grads, clip_norm):
    """``tf.clip_by_global_norm``'s rule (Pascanu et al. 2013)."""
    norm = ops.sqrt(sum(ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads))
    scale = clip_norm / ops.maximum(norm, clip_norm)
    return [g * ops.cast(scale, g.dtype) for g in grads]


def _tensorflow_update(model, optimizer, forward, clip_norm):
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def update(inputs, targets, memories):
        with tf.GradientTape() as tape:
            loss, new_memories = forward(
                lambda *args: model(*args, training=True), inputs, targets, memories)
            total = loss + tf.add_n(model.losses) if model.losses else loss
        variables = model.trainable_variables
        grads = tape.gradient(total, variables)
        if clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, clip_norm)
        optimizer.apply_gradients(zip(grads, variables))
        return loss, new_memories

    return update


def _jax_update(model, optimizer, forward, clip_norm):
    import jax

    state = (model.trainable_variables, model.non_trainable_variables,
             optimizer.variables)

    def total_loss(trainable, non_trainable, inputs, targets, memories):
        def call(*args):
            nonlocal non_trainable, losses
            outputs, non_trainable, losses = model.stateless_call(
                trainable, non_trainable, *args, training=True,
                return_losses=True)
            return outputs

        losses = []
        loss, new_memories = forward(call, inputs, targets, memories)
        return loss + sum(losses), (loss, new_memories, non_trainable)

    gradient = jax.value_and_grad(total_loss, has_aux=True)

    @jax.jit
    def compiled(trainable, non_trainable, optimizer_values, inputs, targets,
                 memories):
        (_, (loss, new_memories, non_trainable)), grads = gradient(
            trainable, non_trainable, inputs, targets, memories)
        if clip_norm is not None:
            grads = _clip_by_global_norm(grads, clip_norm)
        trainable, optimizer_values = optimizer.stateless_apply(
            optimizer_values, grads, trainable)
        return loss, new_memories, (trainable, non_trainable, optimizer_values)

    def update(inputs, targets, memories):
        loss, new_memories, values = compiled(
            *([v.value for v in variables] for variables in state),
            inputs, targets, memories)
        for variables, new_values in zip(state, values):
            for variable, value in zip(variables, new_values):
                variable.assign(value)
        return loss, new_memories

    return update


def _torch_update(model, optimizer, forward, clip_norm):
    import torch

    variables = model.trainable_variables

    def update(inputs, targets, memories):
        for variable in variables:
            variable.value.grad = None
        loss, new_memories = forward(
            lambda *args: model(*args, training=True), inputs, targets, memories)
        total = loss + sum(model.losses) if model.losses else loss
        total.backward()
        grads = [variable.value.grad for variable in variables]
        if clip_norm is not None:
            grads = _clip_by_global_norm(grads, clip_norm)
        with torch.no_grad():
            optimizer.apply(grads, variables)
        return loss.detach(), new_memories

    return update


def train_batches(streams, seg_len):
    """Endless ``(inputs, targets, new_pass)`` over the full-length segments
    of ``streams``, ``new_pass`` True on the first of each pass.

    Example:
    >>> import numpy as np
    >>> batches = train_batches(np.arange(14).reshape(2, 7), 3)
    >>> [next(batches)[2] for _ in range(3)]
    [True, False, True]
    """
    while True:
        for k, (inputs, targets) in enumerate(
                segments(streams, seg_len, drop_remainder=True)):
            yield inputs, targets, k == 0


class SegmentCheckpoint:
    """``train_segments``' state at its last validation in one file,
    ``<directory>/checkpoint.npz``, replaced atomically: the model's and
    optimizer's variables (dropout seed states included), the memories, the
    loop's counters and, under PyTorch, its generators' states (Keras'
    unseeded dropout draws from them there).

    Args:
        directory: folder of the file (created on the first save).
        model, optimizer: the model and its built optimizer.
        run_key: dict of the settings that must match to resume (e.g. the
            job's config).

    ``restore()`` -> None (no file) or ``(state dict, memories)``.

    Raises:
        ValueError: from ``restore``, a file of another run (naming the
            file and the first setting that differs) or of other variables.

    Example:
    >>> import tempfile
    >>> from keras_trm.models import vanilla_transformer_lm
    >>> model = vanilla_transformer_lm(10, num_layers=1, d_model=8, num_heads=2,
    ...                                d_ff=8, max_sequence_length=4)
    >>> optimizer = keras.optimizers.Adam()
    >>> optimizer.build(model.trainable_variables)
    >>> folder = tempfile.mkdtemp()
    >>> checkpoint = SegmentCheckpoint(folder, model, optimizer, {"seed": 0})
    >>> checkpoint.restore() is None
    True
    >>> checkpoint.save({"step": 3}, None)
    >>> checkpoint.restore()[0]["step"]
    3
    """

    def __init__(self, directory, model, optimizer, run_key):
        self.path = pathlib.Path(directory) / "checkpoint.npz"
        self.variables = list(model.variables) + list(optimizer.variables)
        self.run_key = json.loads(json.dumps(run_key))

    def save(self, state, memories):
        arrays = {f"variable_{i}": ops.convert_to_numpy(v)
                  for i, v in enumerate(self.variables)}
        for i, memory in enumerate(memories or []):
            # float32 on file: NumPy has no bfloat16; the cast back is exact.
            arrays[f"memory_{i}"] = ops.convert_to_numpy(ops.cast(memory, "float32"))
        arrays.update(_torch_generator_states())
        state = dict(state, run_key=self.run_key, memory_dtype=(
            keras.backend.standardize_dtype(memories[0].dtype)
            if memories else None))
        buffer = io.BytesIO()
        np.savez(buffer, state=np.array(json.dumps(state)), **arrays)
        with atomic_file(self.path) as tmp:
            tmp.write_bytes(buffer.getvalue())

    def restore(self):
        if not self.path.exists():
            return None
        with np.load(self.path) as data:
            state = json.loads(str(data["state"]))
            stored = state.pop("run_key")
            differs = sorted(k for k in set(stored) | set(self.run_key)
                             if stored.get(k) != self.run_key.get(k))
            if differs:
                name = differs[0]
                raise ValueError(
                    f"{str(self.path)!r} is the checkpoint of another run "
                    f"({name}={stored.get(name)!r} there, {name}="
                    f"{self.run_key.get(name)!r} now): delete it or use "
                    "another workdir")
            count = sum(k.startswith("variable_") for k in data.files)
            if count != len(self.variables) or any(
                    data[f"variable_{i}"].shape != tuple(v.shape)
                    for i, v in enumerate(self.variables)):
                raise ValueError(f"{str(self.path)!r} holds other variables "
                                 "than this model and optimizer")
            for i, variable in enumerate(self.variables):
                variable.assign(data[f"variable_{i}"])
            _set_torch_generator_states(data)
            memories = [ops.cast(data[f"memory_{i}"], state["memory_dtype"])
                        for i in range(sum(k.startswith("memory_")
                                           for k in data.files))]
        state.pop("memory_dtype")
        return state, memories or None


def _torch_generator_states():
    """PyTorch's CPU and CUDA generator states as arrays ({} elsewhere)."""
    if keras.backend.backend() != "torch":
        return {}
    import torch

    states = {"torch_rng_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        states.update({f"torch_rng_cuda_{i}": state for i, state in
                       enumerate(torch.cuda.get_rng_state_all())})
    return {name: state.numpy() for name, state in states.items()}


def _set_torch_generator_states(data):
    """Restores what ``_torch_generator_states`` saved (if it did)."""
    if keras.backend.backend() != "torch" or "torch_rng_cpu" not in data.files:
        return
    import torch

    torch.set_rng_state(torch.from_numpy(data["torch_rng_cpu"]))
    cuda = [torch.from_numpy(data[f"torch_rng_cuda_{i}"]) for i in range(
        sum(k.startswith("torch_rng_cuda_") for k in data.files))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


# Steps timed for the pace under a time budget: from the end of step
# PACE_FROM (after the step's tracing) to PACE_TO, then every validation.
PACE_FROM, PACE_TO = 10, 60


def train_segments(name, step, model, streams, seg_len, steps, eval_every,
                   evaluate, verbose=2, budget_seconds=None, on_fit=None,
                   checkpoint=None):
    """Runs ``steps`` training steps of ``step`` (``make_train_step``) over
    ``streams`` and validates every ``eval_every`` steps and at the end.
    Memories restart at every pass over the streams; ``evaluate()`` returns
    the validation NLL (nats per token).

    With ``budget_seconds`` (training seconds, validation not counted) the
    pace from step ``PACE_FROM`` to ``PACE_TO``, and again at every
    validation, gives the steps the budget holds (at most ``steps``);
    ``on_fit(total_steps)`` is called when that count changes, and training
    stops once the budget is spent. With ``checkpoint`` (a
    ``SegmentCheckpoint``) the state is saved after every validation and a
    run that finds one goes on from it as if never stopped.

    Returns:
        ``(history, train_seconds, eval_seconds)``; ``history`` holds lists
        ``step``, ``train_loss`` (mean since the previous validation),
        ``valid_nll``, ``seconds`` (training seconds so far); its last
        ``step`` is the number of steps run.

    Raises:
        FloatingPointError: a non-finite training loss (names the step).
    """
    history = {"step": [], "train_loss": [], "valid_nll": [], "seconds": []}
    planned = steps
    batches = train_batches(streams, seg_len)
    carries_memory = hasattr(model, "init_memories")
    memories, window = None, []
    train_seconds = eval_seconds = paced_from = 0.0
    k = 0
    restored = checkpoint.restore() if checkpoint is not None else None
    if restored is not None:
        state, memories = restored
        k, steps, history = state["step"], state["steps"], state["history"]
        train_seconds, eval_seconds, paced_from = (
            state["train_seconds"], state["eval_seconds"], state["paced_from"])
        for _ in range(k):  # the batches already trained on
            next(batches)
        if steps != planned and on_fit is not None:
            on_fit(steps)
        print(f"{name}: resumed at step {k} of {steps} ({checkpoint.path})",
              flush=True)
    progbar = keras.utils.Progbar(steps, verbose=verbose,
                                  stateful_metrics=["valid_bits"])
    while k < steps:
        k += 1
        inputs, targets, new_pass = next(batches)
        t0 = time.time()
        if carries_memory and new_pass:
            memories = model.init_memories(inputs.shape[0])
        loss, memories = step(inputs, targets, memories)
        loss = float(loss)
        train_seconds += time.time() - t0
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"{name}: training loss is {loss} at step {k}")
        if budget_seconds:
            if k == PACE_FROM:
                paced_from = train_seconds
            if k == PACE_TO or (k > PACE_TO and k % eval_every == 0):
                pace = (train_seconds - paced_from) / (k - PACE_FROM)
                fitted = min(planned, k + int((budget_seconds - train_seconds) / pace))
                if fitted != steps:
                    steps = max(fitted, k)
                    progbar.target = steps
                    if on_fit is not None:
                        on_fit(steps)
                    if verbose != 1:
                        print(f"{name}: {pace:.3f} s a step; the time budget of "
                              f"{budget_seconds / 60:.1f} min holds {steps} steps",
                              flush=True)
            if train_seconds >= budget_seconds:
                steps = k
        window.append(loss)
        values = [("loss", loss)]
        if k % eval_every == 0 or k == steps:
            t0 = time.time()
            valid = evaluate()
            eval_seconds += time.time() - t0
            history["step"].append(k)
            history["train_loss"].append(round(float(np.mean(window)), 5))
            history["valid_nll"].append(round(valid, 5))
            history["seconds"].append(round(train_seconds, 1))
            window = []
            values.append(("valid_bits", valid / math.log(2)))
            if checkpoint is not None:
                checkpoint.save(dict(
                    step=k, steps=steps, history=history,
                    train_seconds=train_seconds, eval_seconds=eval_seconds,
                    paced_from=paced_from), memories)
            if verbose != 1:
                print(f"{name} step {k}: train loss "
                      f"{history['train_loss'][-1]:.4f} nats, valid "
                      f"{valid / math.log(2):.4f} bits/token, "
                      f"{train_seconds / 60:.1f} min of training",
                      flush=True)
        progbar.update(k, values)
    return history, train_seconds, eval_seconds
