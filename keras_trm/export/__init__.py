"""Export: SavedModel in TF Serving layout (raw-text signatures, optional
warm-up requests); the recipe export wrappers; a LiteRT translator
(encode / decode_step signatures + a host-side runner); CTranslate2
(``keras_trm.export.ctranslate2``, needs the optional ``ctranslate2``
package, imported only when its functions are called)."""

from keras_trm._optional import require_tensorflow

require_tensorflow("keras_trm.export")  # TensorFlow by design

from keras_trm.export.ctranslate2 import (
    CTranslate2Translator,
    export_ctranslate2,
)
from keras_trm.export.litert import LiteRTTranslator, export_translator_litert
from keras_trm.export.saved_model import export_module, next_version
from keras_trm.export.warmup import (
    read_warmup_requests,
    translator_warmup_requests,
    warmup_path,
    write_warmup_requests,
)

# Recipe export wrappers (IMDB, MNIST, Transformer-XL LM).
from keras_trm.export.classifiers import DigitClassifier, ReviewClassifier
from keras_trm.export.language_model import (
    TransformerXLServing,
    export_language_model,
    sample_text,
)

__all__ = [
    "CTranslate2Translator",
    "export_ctranslate2",
    "LiteRTTranslator",
    "export_translator_litert",
    "export_module",
    "next_version",
    "read_warmup_requests",
    "translator_warmup_requests",
    "warmup_path",
    "write_warmup_requests",
    # Recipe export wrappers.
    "DigitClassifier",
    "ReviewClassifier",
    "TransformerXLServing",
    "export_language_model",
    "sample_text",
]
