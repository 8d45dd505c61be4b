"""Learning-rate schedules."""

import numbers

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.training.optimizers import FusedAdam


@keras.saving.register_keras_serializable(package="keras_trm")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Warmup then inverse-square-root decay (Vaswani et al. 2017, Eq. 3).

        lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

    with ``step`` counted from 1 (the optimizer's iteration 0 is step 1);
    the peak, at ``step = warmup_steps``, is ``scale * (d_model *
    warmup_steps)^-0.5``.

    Args:
        d_model: int > 0.
        warmup_steps: int > 0 (4000 in the paper).
        scale: finite float > 0, a constant factor (1.0 in the paper).

    Raises:
        TypeError: ``d_model`` or ``warmup_steps`` not an int, ``scale``
            not a number, naming the argument.
        ValueError: non-positive arguments; ``scale`` NaN or inf.

    Example:
    >>> schedule = NoamSchedule(d_model=512, warmup_steps=4000)
    >>> peak = float(schedule(3999))   # optimizer iteration 3999 is step 4000
    >>> round(peak * (512 * 4000) ** 0.5, 6)
    1.0
    >>> float(schedule(0)) < float(schedule(1000)) < peak > float(schedule(20000))
    True
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model = v.positive_int("d_model", d_model)
        self.warmup_steps = v.positive_int("warmup_steps", warmup_steps)
        self.scale = v.positive_float("scale", scale)

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        return self.scale * (self.d_model**-0.5) * ops.minimum(
            ops.rsqrt(step), step * (self.warmup_steps**-1.5))

    def get_config(self):
        return dict(d_model=self.d_model, warmup_steps=self.warmup_steps,
                    scale=self.scale)


@keras.saving.register_keras_serializable(package="keras_trm")
class BudgetDecay(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule`` fitted to a time budget: once ``TimeBudget`` has
    measured that the budget ends the run early, a linear decay to 0 at the
    last step it holds (Li, Yumer and Ramanan, ICLR 2020, Sec. 3-4: linear
    decay to the budget's end was best across tasks):

        lr(step) = schedule(step) * clip((end - step) / (end - start), 0, 1)

    and ``schedule(step)`` unchanged while ``end`` is 0. ``start`` and
    ``end`` count optimizer iterations; after ``fit`` the train function
    must be made again (``TimeBudget`` does: compiled steps read them when
    traced).

    Args:
        schedule: a ``LearningRateSchedule`` or callable step -> rate.
        start: int >= 0, the step the decay starts from.
        end: int, 0 (no decay) or > ``start``, the step the rate reaches 0.

    Raises:
        TypeError: ``start`` or ``end`` not an int.
        ValueError: ``start`` < 0, or ``end`` neither 0 nor > ``start``.

    Example:
    >>> s = BudgetDecay(lambda step: 1.0)
    >>> float(s(50))
    1.0
    >>> s.fit(start=40, end=60)
    >>> [round(float(s(i)), 2) for i in (40, 50, 60, 70)]
    [1.0, 0.5, 0.0, 0.0]
    """

    def __init__(self, schedule, start=0, end=0):
        self.schedule = schedule
        self.fit(start, end)

    def fit(self, start, end):
        """Sets the decay: from ``start`` to 0 at ``end`` (0: none)."""
        start = v.non_negative_int("start", start)
        end = v.non_negative_int("end", end)
        if end and end <= start:
            raise ValueError(f"`end` must be 0 (no decay) or > start={start}, "
                             f"got end={end}")
        self.start, self.end = start, end

    def __call__(self, step):
        rate = self.schedule(step)
        if not self.end:
            return rate
        left = (self.end - ops.cast(step, "float32")) / float(self.end - self.start)
        return rate * ops.clip(left, 0.0, 1.0)

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "start": self.start, "end": self.end}

    @classmethod
    def from_config(cls, config):
        schedule = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(**{**config, "schedule": schedule})


# Variables that take no weight decay: biases (attention, feed-forward,
# Transformer-XL's u and v) and LayerNormalization's gamma and beta, as in
# BERT's AdamW; matrices and embeddings decay.
NO_WEIGHT_DECAY_NAMES = ("bias", "gamma", "beta")


def paper_adam(learning_rate, weight_decay=0.0, **kwargs):
    """Adam with the paper's β1=0.9, β2=0.98, ε=1e-9 (§5.3): a
    ``FusedAdam``; ``kwargs`` go to it.

    Args:
        learning_rate: finite float > 0, or a schedule (e.g.
            ``NoamSchedule``) or other callable of the step.
        weight_decay: float >= 0; 0 (the paper) adds none. Otherwise
            decoupled weight decay (Loshchilov & Hutter 2019, AdamW): before
            each update every matrix and embedding shrinks by
            ``learning_rate * weight_decay`` of itself (0.01 is usual);
            names containing one of ``NO_WEIGHT_DECAY_NAMES`` are exempt.

    Raises:
        TypeError: ``learning_rate`` neither a number nor a schedule (a
            string, a bool, None); ``weight_decay`` not a number.
        ValueError: ``learning_rate`` a number <= 0, NaN or inf;
            ``weight_decay`` negative, NaN or inf.

    Example:
    >>> optimizer = paper_adam(NoamSchedule(d_model=512))
    >>> optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    (0.9, 0.98, 1e-09)
    >>> paper_adam(1e-3, weight_decay=0.01).weight_decay
    0.01
    """
    learning_rate = _learning_rate(learning_rate)
    weight_decay = v.non_negative_float("weight_decay", weight_decay)
    return FusedAdam(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
        weight_decay=weight_decay or None,
        weight_decay_exclude_names=NO_WEIGHT_DECAY_NAMES if weight_decay else (),
        **kwargs,
    )


def warmup_cosine_decay(learning_rate, total_steps, warmup_steps, alpha=0.0):
    """Linear warm-up from 0 to ``learning_rate`` over ``warmup_steps``,
    then cosine decay to ``alpha * learning_rate`` at ``total_steps``
    (Loshchilov & Hutter 2017, SGDR without restarts; the reference
    Transformer-XL code's ``scheduler='cosine'``): Keras' ``CosineDecay``
    with ``warmup_target``, decaying over ``max(total_steps - warmup_steps,
    1)`` steps.

    Args:
        learning_rate: finite float > 0, the peak.
        total_steps: int > 0.
        warmup_steps: int >= 0.
        alpha: float in [0, 1], the final rate as a fraction of the peak.

    Raises:
        TypeError: an argument of the wrong type, naming it.
        ValueError: ``learning_rate`` not a finite float > 0,
            ``total_steps`` < 1, ``warmup_steps`` < 0, ``alpha`` outside
            [0, 1] or NaN.

    Example:
    >>> schedule = warmup_cosine_decay(1e-3, total_steps=100, warmup_steps=10)
    >>> round(float(schedule(10)), 6), round(float(schedule(100)), 6)
    (0.001, 0.0)
    """
    learning_rate = v.positive_float("learning_rate", learning_rate)
    total_steps = v.positive_int("total_steps", total_steps)
    warmup_steps = v.non_negative_int("warmup_steps", warmup_steps)
    alpha = v.non_negative_float("alpha", alpha)
    if alpha > 1.0:
        raise ValueError(f"`alpha` must be a float in [0, 1] (the final rate "
                         f"as a fraction of the peak), got alpha={alpha!r}")
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(total_steps - warmup_steps, 1),
        alpha=alpha,
        warmup_target=learning_rate,
        warmup_steps=warmup_steps,
    )


def _learning_rate(value):
    """A number is checked (finite, > 0); a schedule, callable or tensor
    passes as it is."""
    if isinstance(value, (numbers.Real, str, bytes)) or value is None:
        return v.positive_float("learning_rate", value)
    return value
