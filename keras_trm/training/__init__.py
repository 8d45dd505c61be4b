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
from keras_trm.training.schedules import NoamSchedule, paper_adam

# Long runs: accumulation, resume, monitoring, multi-worker (issue #11).
from keras_trm.training.accumulation import PerUpdateSchedule, accumulation_steps
from keras_trm.training.distribute import (
    build_for_distributed_fit,
    shard_batches,
    tf_config,
    worker_info,
)
from keras_trm.training.monitoring import (
    BleuLog,
    TensorBoardScalars,
    TimeBudget,
    TokenCount,
    tensorboard_writer,
)
from keras_trm.training.resume import DataPosition, TrainingBackup, write_text_atomic

__all__ = [
    "EpochCheckpoints",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "NoamSchedule",
    "average_checkpoints",
    "select_checkpoint_average",
    "make_strategy",
    "paper_adam",
    "resolve_jit_compile",
    "save_weights_atomic",
    "split_cpu",
    # Long runs (issue #11)
    "BleuLog",
    "DataPosition",
    "PerUpdateSchedule",
    "TensorBoardScalars",
    "TimeBudget",
    "TokenCount",
    "TrainingBackup",
    "accumulation_steps",
    "build_for_distributed_fit",
    "shard_batches",
    "tensorboard_writer",
    "tf_config",
    "worker_info",
    "write_text_atomic",
]
