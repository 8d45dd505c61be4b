"""Limits of the formats keras_trm writes, named apart from the TensorFlow
modules that write them so that the backend-neutral checks (a job's, before
anything is written) can name them."""

# TF Serving reads at most this many records of a SavedModel's
# ``assets.extra/tf_serving_warmup_requests`` (keras_trm.export.warmup).
MAX_WARMUP_RECORDS = 1000
