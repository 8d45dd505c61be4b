"""Training as in Vaswani et al. (2017): schedule, loss, optimizer,
distribution, checkpoints."""

from keras_trm.training.checkpoints import (
    EpochCheckpoints,
    average_checkpoints,
    select_checkpoint_average,
    save_weights_atomic,
)
from keras_trm.training.distribute import (
    make_strategy,
    resolve_jit_compile,
    split_cpu,
)
from keras_trm.training.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_trm.training.presets import PRESETS, apply_preset, preset
from keras_trm.training.schedules import NoamSchedule, paper_adam

__all__ = [
    "EpochCheckpoints",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "NoamSchedule",
    "PRESETS",
    "apply_preset",
    "average_checkpoints",
    "select_checkpoint_average",
    "make_strategy",
    "paper_adam",
    "preset",
    "resolve_jit_compile",
    "save_weights_atomic",
    "split_cpu",
]
