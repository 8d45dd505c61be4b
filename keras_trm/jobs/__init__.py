"""End-to-end jobs behind the recipes and the CLI."""

from keras_trm._optional import require_tensorflow

require_tensorflow("keras_trm.jobs")  # TensorFlow by design
