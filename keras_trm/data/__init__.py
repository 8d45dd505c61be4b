"""Data sets (tfds online, local files offline), the one prepared format
of translation training and its loader; numpy only (no TensorFlow, any
Keras backend), except the tfds downloads and the classification jobs'
``keras_trm.data.batching`` (tf.data)."""

from keras_trm.data.imdb import load_imdb
from keras_trm.data.language_modeling import (
    Vocabulary, batchify, load_ptb, load_text_file, load_tiny_shakespeare, segments,
)
from keras_trm.data.mnist import load_mnist
# Translation training: token ids prepared once (memory-mapped), batched
# by token count on every backend.
from keras_trm.data.loader import (
    DEFAULT_BOUNDARIES, TokenBatches, bucket_boundaries, parse_boundaries,
)
from keras_trm.data.prepared import (
    Prepared, PreparedSplit, prepare_translation_data, read_prepared,
)
from keras_trm.data.paths import ENV_VAR, resolve_data_dir
from keras_trm.data.translation import (
    CorpusError, TranslationSplits, check_parallel_corpus, iter_lines, load_multi30k,
    load_parallel, load_translation_splits, load_wmt14, read_lines, sample_lines,
    translation_eval_files, translation_train_files,
)
# Example checks and the seeded validation split of the classification jobs.
from keras_trm.data.validation import check_labels, validation_split

__all__ = [
    "DEFAULT_BOUNDARIES", "ENV_VAR", "CorpusError", "TranslationSplits", "Vocabulary",
    "batchify", "check_parallel_corpus", "load_imdb", "load_mnist", "load_multi30k",
    "load_parallel", "load_ptb", "load_text_file", "load_tiny_shakespeare",
    "load_translation_splits", "load_wmt14", "iter_lines", "Prepared", "PreparedSplit",
    "TokenBatches", "bucket_boundaries", "parse_boundaries", "prepare_translation_data",
    "read_prepared", "read_lines", "resolve_data_dir", "sample_lines", "segments",
    "translation_eval_files", "translation_train_files", "check_labels",
    "validation_split",
]


# Removed names and what replaces them, as an ImportError: ``from ... import``
# would replace an AttributeError's message by a bare "cannot import name".
_REMOVED = {
    name: (f"keras_trm.data.{name} was removed (issue #61: one prepared format, one "
           "loader). Write token ids once with keras_trm.data.prepare_translation_data("
           "folder, [(split, source_path, target_path)], encode, vocabulary_size, "
           "vocabulary_sha256), open them with read_prepared(folder) and batch them "
           "with keras_trm.data.TokenBatches(prepared.splits[split], tokens_per_batch, "
           "boundaries, seed=...), a keras.utils.PyDataset that fit() takes on every "
           "backend.")
    for name in ("token_bucket_batches", "prepare_shards", "shards_from_pairs",
                 "stream_batches", "stream_steps", "mix_batches", "mix_steps",
                 "read_manifest")
}


def __getattr__(name):
    if name in _REMOVED:
        raise ImportError(_REMOVED[name], name=name, path=__file__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
