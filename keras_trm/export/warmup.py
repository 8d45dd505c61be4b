"""Warm-up requests in TF Serving's format (SavedModel warm-up).

A SavedModel may carry ``assets.extra/tf_serving_warmup_requests``, a
TFRecord file of ``tensorflow.serving.PredictionLog`` protos that TF Serving
(and ``keras-trm serve``) replays before the version becomes ``AVAILABLE``,
so XLA's compilation of the small-batch search (one per batch size and
8-token source bucket, ~2 s each on a 2-core CPU) is paid at load time, not
by the first clients.

See https://www.tensorflow.org/tfx/serving/saved_model_warmup for the
format; the protos are those of the ``tensorflow-serving-api`` package.
"""

import itertools
import pathlib

import tensorflow as tf

from keras_trm._optional import require_extra
from keras_trm.utils.formats import MAX_WARMUP_RECORDS

WARMUP_FILE = "tf_serving_warmup_requests"


def warmup_path(version_dir):
    """Where TF Serving looks for a SavedModel's warm-up requests.

    Example:

    >>> warmup_path("export/transformer_multi30k_en_de/1").as_posix()
    'export/transformer_multi30k_en_de/1/assets.extra/tf_serving_warmup_requests'
    """
    return pathlib.Path(version_dir) / "assets.extra" / WARMUP_FILE


def write_warmup_requests(path, requests):
    """Writes predict requests as TF Serving's warm-up file.

    Args:
        path: the file to write (``warmup_path(version_dir)``); its folder
            must exist.
        requests: sequence of ``(signature_name, inputs)``, ``inputs`` a dict
            input name -> array-like batch (str / bytes for strings), typed
            as ``tf.constant`` types it (floats float32, ints int32).

    Raises:
        ValueError: no requests, more than ``MAX_WARMUP_RECORDS`` (TF
            Serving's limit), or an empty ``signature_name`` / ``inputs``.

    Example:

    >>> import tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / WARMUP_FILE
    >>> write_warmup_requests(path, [
    ...     ("serving_default", {"sentences": ["A dog runs."]})])
    >>> [(name, inputs["sentences"].numpy().tolist())
    ...  for name, inputs in read_warmup_requests(path)]
    [('serving_default', [b'A dog runs.'])]
    """
    require_extra("serve", ["tensorflow_serving"], "warm-up requests")
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    requests = list(requests)
    if not 1 <= len(requests) <= MAX_WARMUP_RECORDS:
        raise ValueError(
            f"`requests` must hold 1 to {MAX_WARMUP_RECORDS} warm-up "
            f"requests (TF Serving's limit), got {len(requests)}")
    records = []
    for i, (signature_name, inputs) in enumerate(requests):
        if not signature_name or not inputs:
            raise ValueError(
                f"warm-up request {i} needs a signature name and inputs, got "
                f"signature_name={signature_name!r}, inputs={inputs!r}")
        request = predict_pb2.PredictRequest()
        request.model_spec.signature_name = signature_name
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        log = prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request))
        records.append(log.SerializeToString())
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:  # all built first: no half-written file
            writer.write(record)


def read_warmup_requests(path):
    """The requests of a warm-up file, as TF Serving replays them.

    Args:
        path: a ``tf_serving_warmup_requests`` file.

    Returns:
        list of ``(signature_name, inputs)``, an empty name read as
        ``"serving_default"`` (as TF Serving does), inputs a dict name ->
        ``tf.Tensor``.

    Raises:
        ValueError: not a TFRecord file, a record not a ``PredictionLog``
            with a predict request (naming the file and record index), or
            more than ``MAX_WARMUP_RECORDS`` records.

    Example:

    >>> import tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / WARMUP_FILE
    >>> write_warmup_requests(path, [("classify", {"x": [[1.0, 2.0]]})])
    >>> (name, inputs), = read_warmup_requests(path)
    >>> name, inputs["x"].shape, inputs["x"].dtype.name
    ('classify', TensorShape([1, 2]), 'float32')
    """
    require_extra("serve", ["tensorflow_serving"], "warm-up requests")
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    try:
        records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))
                   .take(MAX_WARMUP_RECORDS + 1)]
    except tf.errors.OpError as err:
        raise ValueError(f"{str(path)!r} is not a TFRecord file of warm-up "
                         f"requests: {err.message}") from None
    if len(records) > MAX_WARMUP_RECORDS:
        raise ValueError(f"{str(path)!r} holds more than "
                         f"{MAX_WARMUP_RECORDS} warm-up records")
    for i, record in enumerate(records):
        try:
            log = prediction_log_pb2.PredictionLog.FromString(record)
        except Exception as err:  # protobuf's DecodeError
            raise ValueError(f"warm-up record {i} of {str(path)!r} is not a "
                             f"PredictionLog: {err}") from None
        if log.WhichOneof("log_type") != "predict_log":
            raise ValueError(
                f"warm-up record {i} of {str(path)!r} must be a predict_log "
                f"(the only kind replayed here), got "
                f"{log.WhichOneof('log_type')!r}")
        request = log.predict_log.request
        inputs = {name: tf.constant(tf.make_ndarray(proto))
                  for name, proto in request.inputs.items()}
        requests.append((request.model_spec.signature_name or "serving_default",
                         inputs))
    return requests


def _source_bucket_sentences(translator, sentences, max_sentences=10_000):
    """One sentence per source-length bucket of the XLA search: the first
    of ``sentences`` (str; the first ``max_sentences`` looked at) of each
    width ``translator.compiled_width`` gives, shortest width first.
    XLA compiles the search once per width, so replaying them compiles
    every width they reach."""
    kept = [s for s in itertools.islice(sentences, max_sentences) if s.strip()]
    first = {}
    for start in range(0, len(kept), 256):
        batch = kept[start:start + 256]
        ids = translator.encode_text(tf.constant(batch))
        widths = translator.compiled_width(
            tf.reduce_sum(tf.cast(ids > 0, tf.int32), 1)).numpy()
        for sentence, width in zip(batch, widths):
            first.setdefault(int(width), sentence)
    return [first[width] for width in sorted(first)]


def translator_warmup_requests(translator, sentences, signature_name="serving_default",
                               input_name="sentences"):
    """Warm-up requests that compile a ``Translator``'s XLA search at load.

    With ``jit_compile=True`` and ``jit_compile_max_batch_size=n``, XLA
    compiles the search once per batch size 1..n and padded source width:
    this gives, for every batch size, one request per width ``sentences``
    reach (the first sentence of each, repeated to the batch size).

    Args:
        translator: a ``keras_trm.decoding.Translator``.
        sentences: iterable of str (e.g. the validation split's sources;
            never the test split).
        signature_name, input_name: where the translator's ``translate``
            is served (as the translation job exports it by default).

    Returns:
        list of ``(signature_name, {input_name: [str] * batch_size})`` for
        ``export_module(..., warmup_requests=...)``; [] without ``jit_compile``.

    Example:

    >>> from keras_trm.decoding import Translator
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import TextTokenizer
    >>> tokenizer = TextTokenizer(
    ...     ["[PAD]", "[UNK]", "[START]", "[END]", "a", "dog"])
    >>> model = transformer(6, num_layers=1, d_model=8, num_heads=2, d_ff=8,
    ...                     max_sequence_length=32)
    >>> translator = Translator(model, tokenizer, jit_compile=True,
    ...                         jit_compile_max_batch_size=2)
    >>> for name, inputs in translator_warmup_requests(
    ...         translator, ["a dog", "a dog a", "a " * 12]):
    ...     print(name, inputs["sentences"])
    serving_default ['a dog']
    serving_default ['a a a a a a a a a a a a ']
    serving_default ['a dog', 'a dog']
    serving_default ['a a a a a a a a a a a a ', 'a a a a a a a a a a a a ']
    """
    if not translator.jit_compile:
        return []
    # No limit: every batch size runs XLA; warm the single sentences.
    sizes = translator.jit_compile_max_batch_size or 1
    buckets = _source_bucket_sentences(translator, sentences)
    return [(signature_name, {input_name: [sentence] * size})
            for size in range(1, sizes + 1) for sentence in buckets]
