"""Subword vocabularies and tokenizers.

SentencePiece (the default vocabulary; ``learn_sentencepiece``,
``HostSentencePieceTokenizer``) needs no TensorFlow, so it serves every Keras
backend. The in-graph tokenizers that exports carry (``SentencePieceTokenizer``,
WordPiece's ``TextTokenizer``) and the WordPiece learner need TensorFlow:
imported on first use, with an ``ImportError`` naming what to install.
"""

from keras_trm._optional import lazy_module_attributes
from keras_trm.text.sentencepiece import HostSentencePieceTokenizer, learn_sentencepiece
from keras_trm.text.truncation import truncate_head_tail
from keras_trm.utils.ids import END_ID, PAD_ID, RESERVED_TOKENS, START_ID, UNK_ID

_WORDPIECE = ("TextTokenizer", "learn_vocabulary", "load_vocabulary",
              "save_vocabulary")
_lazy = lazy_module_attributes(__name__, {
    "SentencePieceTokenizer": "keras_trm.text.graph_sentencepiece",
    **dict.fromkeys(_WORDPIECE, "keras_trm.text.wordpiece"),
    **dict.fromkeys(("encode_lowercase", "lowercase"), "keras_trm.text.encoding"),
})


def __getattr__(name):
    try:
        return _lazy(name)
    except ImportError as err:
        if name not in _WORDPIECE:
            raise
        raise ImportError(
            f"keras_trm.text.{name}: the WordPiece vocabulary needs TensorFlow "
            "and tensorflow-text (keras-hub's learner and tokenizer), which "
            "are not importable. Without TensorFlow use SentencePiece, the "
            "default vocabulary (vocabulary='auto' or 'sentencepiece_bpe'; "
            "learn_sentencepiece, HostSentencePieceTokenizer).") from err


__all__ = [
    "END_ID", "PAD_ID", "RESERVED_TOKENS", "START_ID", "UNK_ID",
    "HostSentencePieceTokenizer", "SentencePieceTokenizer", "TextTokenizer",
    "encode_lowercase", "learn_sentencepiece", "learn_vocabulary",
    "load_vocabulary", "lowercase", "save_vocabulary", "truncate_head_tail",
]
