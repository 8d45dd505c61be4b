"""Compiling a classifier the way the classification recipes train one."""

import keras

from keras_trm.utils import checks as v
from keras_trm.training.history import BatchLoss
from keras_trm.training.schedules import warmup_cosine_decay


def compile_classifier(model, learning_rate, total_steps, warmup_steps=0,
                       clipnorm=1.0, jit_compile=True):
    """Compiles a probability-output classifier: Adam clipped by norm, a
    linear warm-up then cosine decay to 0 (``warmup_cosine_decay``), sparse
    categorical cross-entropy, metrics ``accuracy`` and ``batch_loss``.

    Args:
        model: a ``keras.Model`` mapping its inputs to probabilities
            ``(batch, num_classes)``; labels are int class ids ``(batch,)``.
        learning_rate: float > 0, the peak learning rate.
        total_steps: int > 0, optimizer updates in the run (the decay's end).
        warmup_steps: int >= 0, updates of linear warm-up from 0.
        clipnorm: float > 0, Adam's per-variable gradient norm clip.
        jit_compile: bool, XLA for the train / test steps.

    Returns:
        ``model``, compiled.

    Raises:
        ValueError/TypeError: a bad ``learning_rate``, ``total_steps``,
            ``warmup_steps`` or ``clipnorm``, naming it.

    Example:
    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((3,)),
    ...                           keras.layers.Dense(2, activation="softmax")])
    >>> model = compile_classifier(model, 1e-3, total_steps=10, warmup_steps=2,
    ...                            jit_compile=False)
    >>> logs = model.train_on_batch(np.ones((4, 3), "float32"),
    ...                             np.array([0, 1, 0, 1]), return_dict=True)
    >>> sorted(logs)
    ['accuracy', 'batch_loss', 'loss']
    """
    schedule = warmup_cosine_decay(learning_rate, total_steps, warmup_steps)
    model.compile(
        optimizer=keras.optimizers.Adam(
            schedule, clipnorm=v.positive_float("clipnorm", clipnorm)),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy", BatchLoss()],
        jit_compile=bool(jit_compile),
    )
    return model
