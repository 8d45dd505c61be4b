"""Export: SavedModel in TF Serving layout (raw-text signatures), and a
LiteRT translator (encode / decode_step signatures + a host-side runner)."""

from keras_trm.export.litert import LiteRTTranslator, export_translator_litert
from keras_trm.export.saved_model import export_module, next_version

__all__ = ["LiteRTTranslator", "export_module", "export_translator_litert",
           "next_version"]
