"""Steps of a given token count on any number of devices: gradient
accumulation (Keras optimizers' ``gradient_accumulation_steps``).

The paper's step holds ~25,000 source + 25,000 target tokens (§5.1). With
``gradient_accumulation_steps=k`` Keras 3.15 calls a learning-rate schedule
with the micro-batch count; ``PerUpdateSchedule`` divides it by k so that
a warmup counts optimizer updates, as in the paper.
"""

import math

import keras
from keras import ops

from keras_trm.utils import checks as v


def accumulation_steps(tokens_per_step, tokens_per_batch, num_replicas=1):
    """Micro-batches per replica in one update: ``ceil(tokens_per_step /
    (tokens_per_batch * num_replicas))``, 1 when ``tokens_per_step`` is 0.

    Args:
        tokens_per_step: int >= 0, tokens (per side) one update should see.
        tokens_per_batch: int > 0, tokens (per side) one device holds.
        num_replicas: int > 0, devices training in sync.

    Raises:
        TypeError: an argument not an int (bool refused), naming it.
        ValueError: negative ``tokens_per_step``; ``tokens_per_batch`` or
            ``num_replicas`` < 1.

    Example:
        >>> accumulation_steps(25000, 4096, num_replicas=2)
        4
        >>> accumulation_steps(0, 4096)
        1
    """
    tokens_per_step = v.non_negative_int("tokens_per_step", tokens_per_step)
    tokens_per_batch = v.positive_int("tokens_per_batch", tokens_per_batch)
    num_replicas = v.positive_int("num_replicas", num_replicas)
    return max(1, math.ceil(tokens_per_step / (tokens_per_batch * num_replicas)))


@keras.saving.register_keras_serializable(package="keras_trm")
class PerUpdateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule(micro_step // gradient_accumulation_steps)``: a schedule
    in optimizer updates.

    Args:
        schedule: a ``LearningRateSchedule`` (e.g. ``NoamSchedule``).
        gradient_accumulation_steps: int >= 1.

    Raises:
        TypeError: ``gradient_accumulation_steps`` not an int.
        ValueError: ``gradient_accumulation_steps`` < 1.

    Example:
        >>> s = PerUpdateSchedule(lambda step: step, 4)
        >>> [int(s(i)) for i in range(9)]
        [0, 0, 0, 0, 1, 1, 1, 1, 2]
    """

    def __init__(self, schedule, gradient_accumulation_steps):
        self.schedule = schedule
        self.gradient_accumulation_steps = v.positive_int(
            "gradient_accumulation_steps", gradient_accumulation_steps)

    def __call__(self, step):
        return self.schedule(ops.floor_divide(
            step, self.gradient_accumulation_steps))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "gradient_accumulation_steps": self.gradient_accumulation_steps}

    @classmethod
    def from_config(cls, config):
        schedule = keras.saving.deserialize_keras_object(config["schedule"])
        return cls(**{**config, "schedule": schedule})
