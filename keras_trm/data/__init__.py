"""Data sets (tfds online, local files offline) and batching."""

from keras_trm.data.batching import token_bucket_batches
from keras_trm.data.paths import ENV_VAR, resolve_data_dir
from keras_trm.data.translation import load_multi30k, load_wmt14

__all__ = [
    "ENV_VAR",
    "load_multi30k",
    "load_wmt14",
    "resolve_data_dir",
    "token_bucket_batches",
]
