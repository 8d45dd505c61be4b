"""Subword vocabularies and in-graph tokenization."""

from keras_trm._optional import require_tensorflow

require_tensorflow("keras_trm.text")  # TensorFlow by design

from keras_trm.text.encoding import encode_lowercase, lowercase
from keras_trm.text.sentencepiece import (
    SentencePieceTokenizer,
    learn_sentencepiece,
)
from keras_trm.text.truncation import truncate_head_tail
from keras_trm.text.wordpiece import (
    END_ID,
    PAD_ID,
    RESERVED_TOKENS,
    START_ID,
    UNK_ID,
    TextTokenizer,
    learn_vocabulary,
    load_vocabulary,
    save_vocabulary,
)

__all__ = [
    "END_ID",
    "PAD_ID",
    "RESERVED_TOKENS",
    "START_ID",
    "UNK_ID",
    "SentencePieceTokenizer",
    "TextTokenizer",
    "encode_lowercase",
    "learn_sentencepiece",
    "learn_vocabulary",
    "load_vocabulary",
    "lowercase",
    "save_vocabulary",
    "truncate_head_tail",
]
