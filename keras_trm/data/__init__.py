"""Data sets (tfds online, local files offline) and batching."""

from keras_trm._optional import require_tensorflow

require_tensorflow("keras_trm.data")  # TensorFlow by design

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
    shards_from_pairs,
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
    "shards_from_pairs",
    "stream_batches",
    "stream_steps",
    "translation_eval_files",
    "translation_train_files",
    # Label checks and the seeded validation split.
    "check_labels",
    "validation_split",
]


# Removed names and what replaces them. The error is an ImportError, not
# an AttributeError: ``from keras_trm.data import <name>`` (how old code
# meets it) replaces an AttributeError by a bare "cannot import name",
# dropping the message; an ImportError reaches the caller as it is.
_REMOVED = {
    "token_bucket_batches": (
        "keras_trm.data.token_bucket_batches was removed (issue #41: one "
        "input pipeline). Prepare the pairs as shards and stream them: "
        "shards = keras_trm.data.shards_from_pairs(source_texts, "
        "target_texts, tokenizer, max_train_length=...) for pairs in memory (or "
        "prepare_shards(source_path, target_path, tokenizer, folder) for "
        "files), then keras_trm.data.stream_batches(shards, "
        "tokens_per_batch, boundaries, seed=..., repeat=...); "
        "stream_steps(shards, ...) counts the batches of an epoch."),
}


def __getattr__(name):
    if name in _REMOVED:
        raise ImportError(_REMOVED[name], name=name, path=__file__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
