"""Export: SavedModel in TF Serving layout (raw-text signatures)."""

from keras_trm.export.saved_model import export_module, next_version

__all__ = ["export_module", "next_version"]
