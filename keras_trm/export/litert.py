"""LiteRT (TFLite) export of keras_trm models, written atomically.

The conversion is Keras' own (``model.export(path, format="litert")``, the
TensorFlow Lite converter underneath); this module adds the atomic write,
the argument checks and a runner for the ``.tflite`` file that uses the
LiteRT interpreter (``ai_edge_litert``), or ``tf.lite.Interpreter`` where
that package is missing.

LiteRT graphs take fixed-rank tensors of numbers: export models whose inputs
are token ids or images (the classifiers, the LeNet CNN, the Transformer's
teacher-forced forward pass). Raw-string signatures with in-graph
tokenization belong in the SavedModel exports.

For translation on a device, ``export_translator_litert`` writes one file
with ``encode`` and ``decode_step`` signatures (the ``Transformer``'s own
methods, dynamic shapes, a key/value cache that grows one position per
step, builtin ops only, optional dynamic-range int8) and the vocabulary in
its metadata; ``LiteRTTranslator`` runs the greedy and beam searches of
``keras_trm.decoding.search`` (the same code as in process and in the
SavedModel) over them.
"""

import pathlib

import numpy as np

from keras_trm._optional import require_extra
from keras_trm.utils import checks
from keras_trm.utils.checks import RenamedAttributes
from keras_trm.utils.files import atomic_file


def export_litert(model, path, input_signature=None, **converter_kwargs):
    """Writes ``model`` as a LiteRT flatbuffer at ``path`` (``.tflite``).

    Args:
        model: a built ``keras.Model``.
        path: target file; must end in ``.tflite``. Its folder is created.
        input_signature: optional ``keras.InputSpec`` / ``tf.TensorSpec``
            structure (default: the model's inputs, batch dimension dynamic).
        **converter_kwargs: passed to the TFLite converter
            (``optimizations``, ``enable_select_tf_ops``, ...).

    Returns:
        ``pathlib.Path`` of the written file.

    Raises:
        ValueError: ``path`` does not end in ``.tflite`` or the model is not
            built.
        FileExistsError: ``path`` exists (nothing is overwritten).
        Any converter error; then no file is left at ``path``.

    Example (see ``litert_predict`` to run the file):

    >>> import pathlib, tempfile, keras
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "dense.tflite"
    >>> export_litert(model, path).name
    'dense.tflite'
    """
    path = pathlib.Path(path)
    if path.suffix != ".tflite":
        raise ValueError(f"`path` must end in .tflite, got {str(path)!r}")
    if not model.built:
        raise ValueError(f"`model` {model.name!r} must be built before export")
    if path.exists():
        raise FileExistsError(f"`path` {str(path)!r} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, suffix=".tflite") as tmp:
        tmp.unlink()  # the exporter refuses to overwrite in some versions
        model.export(str(tmp), format="litert", verbose=False,
                     input_signature=input_signature, **converter_kwargs)
    return path


def _interpreter(model_path, num_threads=None):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - fallback, deprecated in TF
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter(model_path=str(model_path), num_threads=num_threads)


def litert_predict(model_path, inputs, signature_key="serving_default"):
    """Runs a ``.tflite`` file's signature on NumPy inputs.

    Args:
        model_path: the ``.tflite`` file.
        inputs: an array (single-input models), or a dict input name ->
            array (names as in the Keras model's inputs, e.g.
            ``{"encoder_tokens": ..., "decoder_tokens": ...}``). Arrays are
            cast to the graph's dtypes; the batch dimension may vary.
        signature_key: the signature to run.

    Returns:
        The output array for single-output signatures, else a dict name ->
        array.

    Raises:
        ValueError: unknown signature, or input names that differ from the
            signature's.

    Example (the LiteRT file answers as the Keras model does):

    >>> import pathlib, tempfile, keras, numpy as np
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> path = export_litert(model, pathlib.Path(tempfile.mkdtemp()) / "d.tflite")
    >>> x = np.arange(6, dtype="float32").reshape(2, 3)
    >>> bool(np.allclose(litert_predict(path, x), model.predict(x, verbose=0),
    ...                  atol=1e-5))
    True
    """
    interpreter = _interpreter(model_path)
    signatures = interpreter.get_signature_list()
    if signature_key not in signatures:
        raise ValueError(f"`signature_key` {signature_key!r} not in {sorted(signatures)}")
    runner = interpreter.get_signature_runner(signature_key)
    details = runner.get_input_details()
    if not isinstance(inputs, dict):
        if len(details) != 1:
            raise ValueError(f"{model_path} takes inputs {sorted(details)}: pass a dict")
        inputs = {next(iter(details)): inputs}
    if set(inputs) != set(details):
        raise ValueError(f"`inputs` names {sorted(inputs)} differ from the "
                         f"signature's {sorted(details)}")
    outputs = runner(**{k: np.asarray(v, details[k]["dtype"])
                        for k, v in inputs.items()})
    if len(outputs) == 1:
        (out,) = outputs.values()
        return out
    return outputs


# ---------------------------------------------------------------------------
# A translator on LiteRT: encode / decode_step signatures + a host-side runner
# ---------------------------------------------------------------------------

QUANTIZE_MODES = (None, "dynamic_int8")
_VOCABULARY_KEY = "keras_trm_vocabulary"
_CONFIG_KEY = "keras_trm_translator_config"


_FORMAT = 2  # 1: fixed shapes and 128-position caches (before 2026-11-25)


def _cache_names(num_layers, kind):
    """Signature names of the ``kind`` ("self" or "cross") caches, in the
    order of ``Transformer.decode_step``'s ``(keys, values)`` per layer."""
    return [f"{kind}_{part}_{i}" for i in range(num_layers)
            for part in ("keys", "values")]


def _translator_module(model):
    """A ``tf.Module`` with the ``encode`` and ``decode_step`` functions:
    the ``Transformer``'s own methods with dynamic shapes (rows, source
    length and cache length vary from call to call), over caches that grow
    by one position per call."""
    import tensorflow as tf

    num_layers, heads, d_k = (len(model.decoder_layers), model.num_heads,
                              model.key_dim)
    cache_spec = tf.TensorSpec([None, heads, None, d_k], tf.float32)
    module = tf.Module()
    module.model = model  # tracks the variables

    def flat(caches):
        return [tensor for pair in caches for tensor in pair]

    def pairs(tensors):
        return list(zip(tensors[0::2], tensors[1::2]))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32,
                                                name="source_ids")])
    def encode(source_ids):
        caches, _ = model.cross_attention_caches(model.encode(source_ids))
        return dict(zip(_cache_names(num_layers, "cross"), flat(caches)))

    decode_spec = {
        "token": tf.TensorSpec([None, 1], tf.int32, name="token"),
        "index": tf.TensorSpec([], tf.int32, name="index"),
        "source_mask": tf.TensorSpec([None, None], tf.int32,
                                     name="source_mask"),
    }
    for name in (_cache_names(num_layers, "self")
                 + _cache_names(num_layers, "cross")):
        decode_spec[name] = tf.TensorSpec(cache_spec.shape, tf.float32,
                                          name=name)

    @tf.function(input_signature=[decode_spec])
    def decode_step(inputs):
        cross = pairs([inputs[n] for n in _cache_names(num_layers, "cross")])
        logits, caches = model.decode_step(
            inputs["token"], inputs["index"],
            pairs([inputs[n] for n in _cache_names(num_layers, "self")]),
            (cross, None), tf.cast(inputs["source_mask"], tf.bool), grow=True)
        out = {"logits": tf.cast(logits, tf.float32)}
        out.update(zip(_cache_names(num_layers, "self"), flat(caches)))
        return out

    module.encode = encode
    module.decode_step = decode_step
    return module


def _frozen_signatures(module, names):
    """Each of ``module``'s functions with its weights folded in as constants.

    The converter keeps weights shared by several signatures as resource
    variables (VAR_HANDLE / READ_VARIABLE ops, which dynamic-range
    quantization does not touch); freezing each function first gives plain
    constant weights.
    """
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    frozen = tf.Module()
    signatures = {}
    for name in names:
        concrete = getattr(module, name).get_concrete_function()
        constant = convert_variables_to_constants_v2(concrete)

        def make(concrete=concrete, constant=constant):
            @tf.function(input_signature=list(concrete.structured_input_signature[0]))
            def function(*args):
                outputs = constant(*tf.nest.flatten(args))
                return tf.nest.pack_sequence_as(concrete.structured_outputs,
                                                outputs)
            return function

        setattr(frozen, name, make())
        signatures[name] = getattr(frozen, name).get_concrete_function()
    return frozen, signatures


def _add_metadata(flatbuffer, entries):
    """Returns ``flatbuffer`` (bytes) with named metadata buffers added."""
    require_extra("litert", ["ai_edge_litert"], "LiteRT metadata")
    from ai_edge_litert import schema_py_generated as schema
    import flatbuffers

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(flatbuffer, 0))
    model.metadata = list(model.metadata or [])
    model.buffers = list(model.buffers or [])
    for name, data in entries.items():
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(data, np.uint8)
        model.buffers.append(buffer)
        metadata = schema.MetadataT()
        metadata.name = name
        metadata.buffer = len(model.buffers) - 1
        model.metadata.append(metadata)
    builder = flatbuffers.Builder(len(flatbuffer) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def read_litert_metadata(path):
    """Named metadata buffers of a ``.tflite`` file: dict name -> bytes.

    Reads the flatbuffer with LiteRT's schema (``ai_edge_litert``); the
    translator stores ``keras_trm_vocabulary`` (one token a line, UTF-8) and
    ``keras_trm_translator_config`` (JSON) there. Example: see
    ``export_translator_litert``."""
    require_extra("litert", ["ai_edge_litert"], "LiteRT metadata")
    from ai_edge_litert import schema_py_generated as schema

    data = pathlib.Path(path).read_bytes()
    model = schema.Model.GetRootAsModel(data, 0)
    out = {}
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        buffer = model.Buffers(entry.Buffer())
        if buffer.Offset() > 1:  # stored outside the flatbuffer (> 2 GB files)
            raw = data[buffer.Offset():buffer.Offset() + buffer.Size()]
        else:
            raw = buffer.DataAsNumpy().tobytes() if buffer.DataLength() else b""
        out[entry.Name().decode()] = raw
    return out


def litert_op_names(path):
    """Sorted set of the operator names in a ``.tflite`` file's graphs
    (builtin ops are upper-case names like ``FULLY_CONNECTED``; Select TF
    ops appear as ``FlexXxx`` custom ops). Example: see
    ``export_translator_litert``."""
    interpreter = _interpreter(path)
    return sorted({op["op_name"] for op in interpreter._get_ops_details()})


def export_translator_litert(model, path, vocabulary, quantize=None,
                             max_source_length=None):
    """Writes a Transformer as one ``.tflite`` translator with two signatures.

    The signatures are the model's own decoding methods, with dynamic
    shapes (N rows, T source positions, S positions decoded so far; h heads
    of d_k; one ``keys`` and one ``values`` tensor per decoder layer l):

    - ``encode(source_ids int32 (N, T)) -> cross_keys_<l>,
      cross_values_<l> float32 (N, h, T, d_k)``:
      ``Transformer.cross_attention_caches(Transformer.encode(ids))``;
    - ``decode_step(token int32 (N, 1), index int32 (), source_mask int32
      (N, T) (1 at real source tokens), self_keys_<l>, self_values_<l>
      float32 (N, h, S, d_k), cross_keys_<l>, cross_values_<l>) -> logits
      float32 (N, vocabulary), self_keys_<l>, self_values_<l> (N, h, S + 1,
      d_k)``: ``Transformer.decode_step`` at position ``index`` (0 =
      START), S = ``index``.

    Only builtin LiteRT ops are allowed (no Select TF ops / Flex delegate).
    The vocabulary and the configuration are stored in the file's metadata,
    so ``LiteRTTranslator(path)`` needs nothing else. Conversion goes
    through a temporary SavedModel and
    ``tf.lite.TFLiteConverter.from_saved_model`` with ``signature_keys``
    (TensorFlow Lite guide, "Signatures in TensorFlow Lite");
    ``quantize="dynamic_int8"`` adds ``optimizations=[Optimize.DEFAULT]``:
    weights stored int8, activations quantized on the fly (dynamic-range
    quantization, LiteRT post-training quantization guide).

    Args:
        model: a model built by ``keras_trm.models.transformer`` (any
            precision: a mixed-precision model is exported from a float32
            copy of its weights).
        path: target file ending in ``.tflite`` (its folder is created).
        vocabulary: list of str, the shared WordPiece vocabulary the model
            was trained with (first four tokens ``RESERVED_TOKENS``).
        quantize: ``None`` (float32) or ``"dynamic_int8"``.
        max_source_length: source tokens kept by ``LiteRTTranslator``, END
            included (default: the model's max_sequence_length); longer sources are
            truncated.

    Returns:
        ``pathlib.Path`` of the written file.

    Raises:
        ValueError: ``path`` not ``.tflite``, bad ``quantize`` or
            ``max_source_length``, a vocabulary whose size differs from the
            model's, or a graph that needs ops other than LiteRT builtins.
        FileExistsError: ``path`` exists. No file is left at ``path`` on
            any error.

    Example:

    >>> import tempfile, pathlib
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import RESERVED_TOKENS
    >>> vocab = list(RESERVED_TOKENS) + ["a", "b", "c", "d"]
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_sequence_length=8)
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "tiny.tflite"
    >>> export_translator_litert(model, out, vocab).name
    'tiny.tflite'
    >>> from keras_trm.decoding import BeamSearch
    >>> runner = LiteRTTranslator(out, search=BeamSearch(beam_size=2))
    >>> sorted(runner.signatures)
    ['decode_step', 'encode']
    >>> [type(t).__name__ for t in runner.translate_texts(["a b c", " "])]
    ['str', 'str']
    >>> "FULLY_CONNECTED" in litert_op_names(out)
    True
    >>> read_litert_metadata(out)["keras_trm_vocabulary"].split()[4:]
    [b'a', b'b', b'c', b'd']
    """
    import json
    import tempfile

    import tensorflow as tf

    from keras_trm.models.transformer import as_transformer
    from keras_trm.text.wordpiece import RESERVED_TOKENS

    path = pathlib.Path(path)
    if path.suffix != ".tflite":
        raise ValueError(f"`path` must end in .tflite, got {str(path)!r}")
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"`quantize` must be one of {QUANTIZE_MODES}, got "
                         f"quantize={quantize!r}")
    from keras_trm.training.precision import float32_copy

    # LiteRT builtins are float32 (or int8): a bf16-trained model is
    # exported from a float32 copy of its weights, as the SavedModel is.
    model = float32_copy(as_transformer(model))
    limit = int(model.max_sequence_length)
    source_length = limit if max_source_length is None else max_source_length
    if isinstance(source_length, bool) or not isinstance(source_length, int) \
            or not 1 < source_length <= limit:
        raise ValueError(f"`max_source_length` must be an int in [2, {limit}], "
                         f"got max_source_length={max_source_length!r}")
    vocabulary = list(vocabulary)
    if tuple(vocabulary[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
        raise ValueError(f"`vocabulary` must start with {RESERVED_TOKENS}, "
                         f"got {tuple(vocabulary[:4])}")
    if len(vocabulary) != model.target_vocabulary_size:
        raise ValueError(f"`vocabulary` has {len(vocabulary)} tokens but the "
                         f"model's output has {model.target_vocabulary_size}")
    if any("\n" in token for token in vocabulary):
        raise ValueError("`vocabulary` tokens must not contain newlines")
    if path.exists():
        raise FileExistsError(f"`path` {str(path)!r} already exists")

    module = _translator_module(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".tmp-savedmodel-") as saved, \
            atomic_file(path, suffix=".tflite") as tmp:
        frozen, signatures = _frozen_signatures(module, ["encode", "decode_step"])
        tf.saved_model.save(frozen, saved, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            saved, signature_keys=["encode", "decode_step"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize == "dynamic_int8":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        try:
            flatbuffer = converter.convert()
        except Exception as error:  # the converter's ConverterError
            raise ValueError(
                "the translator graph needs ops that are not LiteRT builtins "
                f"(Select TF ops are not allowed): {error}") from error
        config = {"format": _FORMAT, "max_source_length": source_length,
                  "max_sequence_length": limit,
                  "num_layers": len(model.decoder_layers),
                  "num_heads": int(model.num_heads),
                  "key_dim": int(model.key_dim),
                  "vocabulary_size": len(vocabulary), "quantize": quantize}
        flatbuffer = _add_metadata(flatbuffer, {
            _VOCABULARY_KEY: ("\n".join(vocabulary) + "\n").encode("utf-8"),
            _CONFIG_KEY: json.dumps(config).encode("utf-8"),
        })
        with open(tmp, "wb") as f:
            f.write(flatbuffer)
        ops = litert_op_names(tmp)
        custom = [op for op in ops if op.startswith("Flex") or op == "CUSTOM"]
        if custom:
            raise ValueError(f"the converted graph uses non-builtin ops {custom}")
        if path.exists():
            raise FileExistsError(f"`path` {str(path)!r} already exists")
    return path


class _LiteRTModel:
    """A ``keras_trm.decoding.DecodingModel`` over a translator file's
    ``encode`` / ``decode_step`` signatures, so that the searches run
    unchanged, in a ``tf.function``, with one interpreter call per step
    (``tf.numpy_function``); its caches only grow (graph search).

    The file's ``encode`` runs on the rows the search decodes:
    ``encode`` here passes the ids through and ``cross_attention_caches``
    runs the file's ``encode``.
    """

    def __init__(self, runner):
        self.runner = runner
        self.max_sequence_length = runner.max_sequence_length
        self.target_vocabulary_size = int(runner.config["vocabulary_size"])
        self.num_layers = runner.num_layers
        self._cache_shape = [None, int(runner.config["num_heads"]), None,
                             int(runner.config["key_dim"])]

    def _call(self, function, inputs, output_names, shapes):
        """Runs a signature on the tensors ``inputs`` (a dict) inside the
        search's graph; outputs as tensors, in ``output_names`` order."""
        import tensorflow as tf

        names = list(inputs)

        def run(*arrays):
            out = function(**dict(zip(names, arrays)))
            return [out[name] for name in output_names]

        outputs = tf.numpy_function(run, list(inputs.values()),
                                    [tf.float32] * len(output_names),
                                    stateful=True)
        for tensor, shape in zip(outputs, shapes):
            tensor.set_shape(shape)
        return outputs

    def encode(self, encoder_tokens):
        return encoder_tokens

    def cross_attention_caches(self, source_ids):
        names = _cache_names(self.num_layers, "cross")
        flat = self._call(self.runner._encode, {"source_ids": source_ids},
                          names, [self._cache_shape] * len(names))
        return list(zip(flat[0::2], flat[1::2])), None  # the file has its logits

    def empty_caches(self, batch_size, num_positions, dtype):
        import tensorflow as tf

        shape = list(self._cache_shape)
        shape[0], shape[2] = batch_size, num_positions
        empty = tf.zeros(shape, tf.float32)
        return [(empty, empty) for _ in range(self.num_layers)]

    def decode_step(self, tokens, index, caches, cross, encoder_padding_mask,
                    grow=True):
        import tensorflow as tf

        inputs = {"token": tf.cast(tokens, tf.int32),
                  "index": tf.cast(index, tf.int32),
                  "source_mask": tf.cast(encoder_padding_mask, tf.int32)}
        for kind, pairs in (("self", caches), ("cross", cross[0])):
            flat = [tensor for pair in pairs for tensor in pair]
            inputs.update(zip(_cache_names(self.num_layers, kind), flat))
        names = ["logits"] + _cache_names(self.num_layers, "self")
        shapes = ([[None, self.target_vocabulary_size]]
                  + [self._cache_shape] * (len(names) - 1))
        logits, *flat = self._call(self.runner._decode, inputs, names, shapes)
        return logits, list(zip(flat[0::2], flat[1::2]))


class LiteRTTranslator(RenamedAttributes):
    """Translates raw text with a ``.tflite`` from ``export_translator_litert``.

    The graph runs on the LiteRT interpreter (``ai_edge_litert``); the
    search is ``keras_trm.decoding``'s strategy itself (the same code as in
    process and in the SavedModel, in a ``tf.function`` on the host) over
    the file's ``decode_step``, with the ``[START]`` / ``[END]`` /
    ``[PAD]`` ids of the file's vocabulary. Sentences are decoded
    ``batch_size`` at a time, each of T source tokens (END included) with
    at most min(T + 50, max_sequence_length - 1) generated tokens.
    Tokenization uses the file's vocabulary with
    ``keras_trm.text.TextTokenizer`` (TensorFlow on the host). Sources
    longer than ``max_source_length - 1`` subwords are truncated, as in
    ``decoding.Translator``.

    Args:
        path: the ``.tflite`` file.
        num_threads: int >= 1, interpreter threads.
        search: a ``keras_trm.decoding`` strategy, ``BeamSearch(...)`` or
            ``GreedySearch()`` (default ``BeamSearch()``: beam 4, α 0.6),
            as for ``keras_trm.decoding.Translator``.
        batch_size: int >= 1, sentences per search.

    ``translate_texts(list of str) -> list of str``; ``translate_ids(int
    (n, T) source ids with END) -> list of int lists`` (generated ids,
    without START, END excluded).

    Raises:
        TypeError: ``num_threads`` or ``batch_size`` not an int, ``search``
            not a strategy.
        ValueError: bad argument (named with its value), or a file without
            the translator's signatures / metadata (or written by an older
            keras_trm with fixed shapes: export it again).
        FileNotFoundError: ``path`` does not exist.

    Example (a tiny untrained model; ``export_translator_litert`` shows
    more):

    >>> import tempfile, pathlib
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import RESERVED_TOKENS
    >>> vocab = list(RESERVED_TOKENS) + ["a", "b"]
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_sequence_length=6)
    >>> path = export_translator_litert(
    ...     model, pathlib.Path(tempfile.mkdtemp()) / "t.tflite", vocab)
    >>> from keras_trm.decoding import GreedySearch
    >>> runner = LiteRTTranslator(path, search=GreedySearch())
    >>> len(runner.translate_texts(["a b"]))
    1
    """

    RENAMED_ATTRIBUTES = {"max_length": "max_sequence_length"}

    def __init__(self, path, num_threads=2, search=None, batch_size=32):
        import json

        from keras_trm.decoding.search import check_search

        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"`path` {str(path)!r} does not exist")
        checks.positive_int("num_threads", num_threads)
        checks.positive_int("batch_size", batch_size)
        metadata = read_litert_metadata(path)
        if _CONFIG_KEY not in metadata or _VOCABULARY_KEY not in metadata:
            raise ValueError(f"{str(path)!r} was not written by "
                             "export_translator_litert (no translator metadata)")
        self.config = json.loads(metadata[_CONFIG_KEY].decode("utf-8"))
        if self.config.get("format") != _FORMAT:
            raise ValueError(
                f"{str(path)!r} has the fixed-shape translator format of an "
                "older keras_trm; export it again with export_translator_litert")
        self.vocabulary = metadata[_VOCABULARY_KEY].decode("utf-8").split("\n")[:-1]
        # The special ids, from the file's own vocabulary (the tokenizer's
        # [START] / [END] / [PAD]; the export checks that [PAD] is id 0,
        # the model's mask convention).
        from keras_trm.text.wordpiece import END, PAD, START

        missing = [t for t in (START, END, PAD) if t not in self.vocabulary]
        if missing:
            raise ValueError(f"{str(path)!r}: the vocabulary in the file has no "
                             f"{' / '.join(missing)} token")
        self.start_id = self.vocabulary.index(START)
        self.end_id = self.vocabulary.index(END)
        self.pad_id = self.vocabulary.index(PAD)
        self.path = path
        self.batch_size = batch_size
        self.num_layers = int(self.config["num_layers"])
        # Files exported before the rename name it ``max_length``.
        self.max_sequence_length = int(self.config.get(
            "max_sequence_length", self.config.get("max_length")))
        self.max_source_length = int(self.config["max_source_length"])
        self.search = check_search(self, search)
        self.interpreter = _interpreter(path, num_threads)
        self.signatures = self.interpreter.get_signature_list()
        self._encode = self.interpreter.get_signature_runner("encode")
        self._decode = self.interpreter.get_signature_runner("decode_step")
        self._tokenizer = None
        self._search_function = None

    # -- ids ---------------------------------------------------------------

    def _search(self, block):
        """int32 (sentences, T) source ids -> (sentences, steps) ids."""
        import tensorflow as tf

        if self._search_function is None:
            model = _LiteRTModel(self)

            @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
            def search(ids):
                return self.search(model, ids, start_id=self.start_id,
                                   end_id=self.end_id, pad_id=self.pad_id)

            self._search_function = search
        return self._search_function(tf.constant(block)).numpy()

    def translate_ids(self, source_ids):
        """int ``(n, T)`` source ids (END included, ``pad_id``-padded, T <=
        ``max_source_length``) -> list of n lists of generated ids (END and
        what follows dropped)."""
        source_ids = np.asarray(source_ids)
        if source_ids.ndim != 2 or source_ids.shape[1] > self.max_source_length:
            raise ValueError(
                "`source_ids` must have shape (n, T <= "
                f"{self.max_source_length}), got shape {source_ids.shape}")
        padded = source_ids.astype(np.int32)
        results = []
        for start in range(0, len(padded), self.batch_size):
            block = padded[start:start + self.batch_size]
            # Drop padding columns.
            used = np.flatnonzero((block != self.pad_id).any(0))
            block = block[:, :used[-1] + 1 if len(used) else 1]
            for row in self._search(block):
                row = row.tolist()
                results.append(row[:row.index(self.end_id)]
                               if self.end_id in row else
                               [t for t in row if t != self.pad_id])
        return results

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from keras_trm.text.wordpiece import TextTokenizer

            self._tokenizer = TextTokenizer(self.vocabulary)
        return self._tokenizer

    def encode_texts(self, sentences):
        """list of str -> int32 (n, T) ids + END, ``pad_id``-padded (as
        ``decoding.Translator.encode_text``)."""
        ids = self.tokenizer.tokenize(list(sentences)).to_list()
        ids = [row[:self.max_source_length - 1] + [self.end_id] for row in ids]
        out = np.full((len(ids), max(map(len, ids), default=1)), self.pad_id,
                      np.int32)
        for i, row in enumerate(ids):
            out[i, :len(row)] = row
        return out

    def translate_texts(self, sentences):
        """list of str -> list of str (empty or blank sentence -> "")."""
        sentences = list(sentences)
        if not sentences:
            return []
        if not all(isinstance(s, str) for s in sentences):
            raise TypeError("`sentences` must be a list of str")
        generated = self.translate_ids(self.encode_texts(sentences))
        width = max(map(len, generated)) + 1
        ids = np.zeros((len(generated), width), np.int32)
        for i, row in enumerate(generated):
            ids[i, :len(row)] = row
        text = [t.decode("utf-8") for t in
                self.tokenizer.detokenize(ids).numpy()]
        return ["" if not s.strip() else t for s, t in zip(sentences, text)]
