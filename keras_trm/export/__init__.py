"""Export: SavedModel in TF Serving layout (raw-text signatures); CTranslate2
(``keras_trm.export.ctranslate2``, needs the optional ``ctranslate2``
package, imported only when its functions are called)."""

from keras_trm.export.ctranslate2 import (
    CTranslate2Translator,
    export_ctranslate2,
)
from keras_trm.export.saved_model import export_module, next_version

__all__ = [
    "CTranslate2Translator",
    "export_ctranslate2",
    "export_module",
    "next_version",
]
