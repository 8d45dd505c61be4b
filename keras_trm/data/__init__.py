"""Data sets (tfds online, local files offline) and batching."""

from keras_trm._optional import require_tensorflow

require_tensorflow("keras_trm.data")  # TensorFlow by design

from keras_trm.data.batching import token_bucket_batches
from keras_trm.data.imdb import load_imdb
from keras_trm.data.language_modeling import (
    Vocabulary,
    batchify,
    load_ptb,
    load_tiny_shakespeare,
    segments,
)
from keras_trm.data.mnist import load_mnist
# Streaming translation data: prepared TFRecord shards, token-count batches.
from keras_trm.data.shards import (
    mix_batches,
    mix_steps,
    prepare_shards,
    read_manifest,
    stream_batches,
    stream_steps,
)
from keras_trm.data.paths import ENV_VAR, resolve_data_dir
from keras_trm.data.translation import (
    CorpusError,
    TranslationSplits,
    check_parallel_corpus,
    load_multi30k,
    load_parallel,
    load_translation_splits,
    load_wmt14,
    iter_lines,
    read_lines,
    sample_lines,
    translation_eval_files,
    translation_train_files,
)

# Example checks and the seeded validation split of the classification jobs.
from keras_trm.data.validation import check_labels, validation_split

__all__ = [
    "ENV_VAR",
    "CorpusError",
    "TranslationSplits",
    "Vocabulary",
    "batchify",
    "check_parallel_corpus",
    "load_imdb",
    "load_mnist",
    "load_multi30k",
    "load_parallel",
    "load_ptb",
    "load_tiny_shakespeare",
    "load_translation_splits",
    "load_wmt14",
    "iter_lines",
    "mix_batches",
    "mix_steps",
    "prepare_shards",
    "read_manifest",
    "read_lines",
    "resolve_data_dir",
    "sample_lines",
    "segments",
    "stream_batches",
    "stream_steps",
    "token_bucket_batches",
    "translation_eval_files",
    "translation_train_files",
    # Label checks and the seeded validation split.
    "check_labels",
    "validation_split",
]
