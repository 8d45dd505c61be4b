"""Training as in Vaswani et al. (2017): schedule, loss, optimizer,
distribution, checkpoints."""

from keras_trm._optional import lazy_module_attributes
from keras_trm.training.checkpoints import (
    EpochCheckpoints,
    average_checkpoints,
    select_checkpoint_average,
    save_weights_atomic,
)
from keras_trm.training.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_trm.training.precision import (
    apply_precision,
    cpu_has_native_bf16,
    float32_copy,
    resolve_precision,
)
from keras_trm.training.presets import PRESETS, apply_preset, preset
from keras_trm.training.optimizers import FusedAdam
from keras_trm.training.schedules import (
    BudgetDecay,
    NoamSchedule,
    paper_adam,
    warmup_cosine_decay,
)

# Per-step logs (keras_trm.jobs use them).
from keras_trm.training.classification import compile_classifier
from keras_trm.training.history import (
    BatchLoss,
    StepLog,
    describe_fit,
    fit_summary,
    restore_best_epoch,
)
# Long runs: accumulation, resume (issue #11).
from keras_trm.training.accumulation import PerUpdateSchedule, accumulation_steps
from keras_trm.training.progress import StepTimes, TimeBudget, TokenCount
from keras_trm.training.resume import DataPosition, TrainingBackup
# Validation score log and TensorBoard scalars (TensorFlow only when a
# writer is made).
from keras_trm.training.monitoring import (
    BleuLog,
    TensorBoardScalars,
    tensorboard_writer,
)

# TensorFlow by design (tf.distribute strategies, the language-model
# segment stream): imported on first use, with an error naming what to
# install where TensorFlow is missing.
_TENSORFLOW_ONLY = {
    **dict.fromkeys(
        ("make_strategy", "resolve_jit_compile", "split_cpu",
         "build_for_distributed_fit", "shard_batches", "tf_config",
         "worker_info"), "keras_trm.training.distribute"),
    **dict.fromkeys(("lm_loss", "make_train_step", "train_segments"),
                    "keras_trm.training.language_model"),
}
_lazy = lazy_module_attributes(__name__, _TENSORFLOW_ONLY)


def __getattr__(name):
    if name == "GreedyBleu":  # moved: training does not import decoding
        import warnings

        warnings.warn("keras_trm.training.GreedyBleu is now "
                      "keras_trm.decoding.GreedyBleu", DeprecationWarning,
                      stacklevel=2)
        from keras_trm.decoding.translator import GreedyBleu

        return GreedyBleu
    return _lazy(name)

__all__ = [
    "EpochCheckpoints", "LabelSmoothedCrossEntropy", "MaskedAccuracy",
    "BudgetDecay", "NoamSchedule", "apply_precision", "float32_copy",
    "PRESETS", "apply_preset", "average_checkpoints", "cpu_has_native_bf16",
    "select_checkpoint_average", "make_strategy", "paper_adam", "FusedAdam",
    "preset", "resolve_jit_compile", "resolve_precision",
    "save_weights_atomic", "split_cpu",
    # Per-step logs, language-model steps.
    "BatchLoss", "compile_classifier", "StepLog", "describe_fit",
    "fit_summary", "lm_loss", "make_train_step", "restore_best_epoch",
    "train_segments", "warmup_cosine_decay",
    # Long runs (issue #11)
    "BleuLog", "DataPosition", "PerUpdateSchedule", "TensorBoardScalars",
    "StepTimes", "TimeBudget", "TokenCount", "TrainingBackup",
    "accumulation_steps", "build_for_distributed_fit", "shard_batches",
    "tensorboard_writer", "tf_config", "worker_info",
]
