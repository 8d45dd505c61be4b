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
with ``encode`` and ``decode_step`` signatures (fixed shapes, a fixed-size
key/value cache, builtin ops only, optional dynamic-range int8) and the
vocabulary in its metadata; ``LiteRTTranslator`` runs the greedy and beam
searches of ``keras_trm.decoding.search`` (the same code as in process and
in the SavedModel, run eagerly on the host) over them.
"""

import pathlib

import numpy as np

from keras_trm.utils.files import atomic_file


def _check_int_at_least_1(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1, got {name}={value!r}")


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


def _interpreter(model_path):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - fallback, deprecated in TF
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter(model_path=str(model_path))


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


def _translator_module(model, batch_size, source_length, cache_length):
    """A ``tf.Module`` with the ``encode`` and ``decode_step`` functions.

    Built from the ``Transformer``'s fixed-cache decoding methods
    (``encode``, ``static_cross_attention_caches``,
    ``static_empty_self_attention_caches``, ``static_decode_step``); cache
    shapes come from tracing them, not from here.
    """
    import tensorflow as tf

    num_layers = len(model.decoder_layers)
    source_spec = tf.TensorSpec([batch_size, source_length], tf.int32,
                                name="source_ids")

    # Shapes of the caches, from the pieces themselves.
    cross_shapes = [
        c.shape for c in tf.function(
            lambda ids: model.static_cross_attention_caches(model.encode(ids))
        ).get_concrete_function(source_spec).structured_outputs
    ]
    self_shapes = [
        tuple(c.shape) for c in model.static_empty_self_attention_caches(
            batch_size, cache_length, "float32")
    ]

    module = tf.Module()
    module.model = model  # tracks the variables

    @tf.function(input_signature=[source_spec])
    def encode(source_ids):
        encoder_outputs = model.encode(source_ids)
        out = {"encoder_outputs": encoder_outputs}
        for i, cache in enumerate(model.static_cross_attention_caches(encoder_outputs)):
            out[f"cross_attention_cache_{i}"] = cache
        return out

    decode_spec = {
        "token": tf.TensorSpec([batch_size, 1], tf.int32, name="token"),
        "index": tf.TensorSpec([], tf.int32, name="index"),
        "source_ids": source_spec,
    }
    for i in range(num_layers):
        decode_spec[f"self_attention_cache_{i}"] = tf.TensorSpec(
            self_shapes[i], tf.float32, name=f"self_attention_cache_{i}")
        decode_spec[f"cross_attention_cache_{i}"] = tf.TensorSpec(
            cross_shapes[i], tf.float32, name=f"cross_attention_cache_{i}")

    @tf.function(input_signature=[decode_spec])
    def decode_step(inputs):
        logits, caches = model.static_decode_step(
            inputs["token"],
            inputs["index"],
            [inputs[f"self_attention_cache_{i}"] for i in range(num_layers)],
            [inputs[f"cross_attention_cache_{i}"] for i in range(num_layers)],
            tf.not_equal(inputs["source_ids"], 0),
        )
        out = {"logits": tf.cast(logits, tf.float32)}
        for i, cache in enumerate(caches):
            out[f"self_attention_cache_{i}"] = cache
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
                             batch_size=4, max_source_length=None):
    """Writes a Transformer as one ``.tflite`` translator with two signatures.

    Signatures (all shapes fixed at export; B = ``batch_size``, T =
    ``max_source_length``, S = the model's ``max_length``, h heads of d_k):

    - ``encode(source_ids int32 (B, T)) -> encoder_outputs float32
      (B, T, d_model), cross_attention_cache_<l> float32 (B, 2, T, h, d_k)``
      for each decoder layer l (keys/values of the encoder outputs);
    - ``decode_step(token int32 (B, 1), index int32 (), source_ids,
      self_attention_cache_<l> (B, 2, S, h, d_k), cross_attention_cache_<l>)
      -> logits float32 (B, vocabulary), self_attention_cache_<l>``: the
      decoder at position ``index`` (0 = START), writing that position's
      keys/values into the fixed-size self-attention cache (as in
      ``keras_trm.decoding.search``). ``source_ids`` gives the padding mask.

    Only builtin LiteRT ops are allowed (no Select TF ops / Flex delegate).
    The vocabulary and the shapes are stored in the file's metadata, so
    ``LiteRTTranslator(path)`` needs nothing else. Conversion goes through a
    temporary SavedModel and ``tf.lite.TFLiteConverter.from_saved_model``
    with ``signature_keys`` (TensorFlow Lite guide, "Signatures in TensorFlow
    Lite"); ``quantize="dynamic_int8"`` adds ``optimizations=[Optimize
    .DEFAULT]``: weights stored int8, activations quantized on the fly
    (dynamic-range quantization, LiteRT post-training quantization guide).

    Args:
        model: a model built by ``keras_trm.models.transformer``.
        path: target file ending in ``.tflite`` (its folder is created).
        vocabulary: list of str, the shared WordPiece vocabulary the model
            was trained with (first four tokens ``RESERVED_TOKENS``).
        quantize: ``None`` (float32) or ``"dynamic_int8"``.
        batch_size: int >= 1, rows per call (greedy: sentences decoded
            together; beam search with k beams: ``batch_size // k``
            sentences).
        max_source_length: source positions T, END included (default: the
            model's max_length); sources are 0-padded to T.

    Returns:
        ``pathlib.Path`` of the written file.

    Raises:
        ValueError: ``path`` not ``.tflite``, bad ``quantize``,
            ``batch_size`` or ``max_source_length``, a vocabulary whose
            size differs from the model's, or a graph that needs ops other
            than LiteRT builtins.
        FileExistsError: ``path`` exists. No file is left at ``path`` on
            any error.

    Example:

    >>> import tempfile, pathlib
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import RESERVED_TOKENS
    >>> vocab = list(RESERVED_TOKENS) + ["a", "b", "c", "d"]
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_length=8)
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "tiny.tflite"
    >>> export_translator_litert(model, out, vocab, batch_size=2).name
    'tiny.tflite'
    >>> runner = LiteRTTranslator(out, beam_size=2)
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
    _check_int_at_least_1("batch_size", batch_size)
    model = as_transformer(model)
    limit = int(model.max_length)
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

    module = _translator_module(model, batch_size, source_length, limit)
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
        config = {"batch_size": batch_size, "max_source_length": source_length,
                  "max_length": limit, "num_layers": len(model.decoder_layers),
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
    """The fixed-cache decoding interface of ``Transformer``
    (``encode``, ``static_cross_attention_caches``,
    ``static_empty_self_attention_caches``, ``static_decode_step``,
    ``max_length``, ``target_vocabulary_size``; what
    ``keras_trm.decoding.search`` calls with
    ``static_cache=True``) over a translator file's ``encode`` /
    ``decode_step`` signatures, so that the searches run on the LiteRT
    interpreter unchanged (eagerly, one interpreter call per step).

    The file's ``encode`` runs on the rows the search decodes (after the
    beam search repeats each sentence k times); ``encode`` here passes the
    ids through. The "cross-attention caches" carry the source ids padded
    to the file's width, which ``decode_step`` takes for its mask.
    """

    def __init__(self, runner):
        self.runner = runner
        self.max_length = runner.max_length
        self.target_vocabulary_size = int(runner.config["vocabulary_size"])

    def encode(self, encoder_tokens):
        return encoder_tokens

    def static_cross_attention_caches(self, source_ids):
        import tensorflow as tf

        ids = np.asarray(source_ids, np.int32)
        source = np.zeros((ids.shape[0], self.runner.max_source_length), np.int32)
        source[:, :ids.shape[1]] = ids
        out = self.runner._encode(source_ids=source)
        return ([tf.constant(out[f"cross_attention_cache_{i}"])
                 for i in range(self.runner.num_layers)], tf.constant(source))

    def static_empty_self_attention_caches(self, batch_size, max_length,
                                           dtype):
        import tensorflow as tf

        details = self.runner._decode.get_input_details()
        return [tf.zeros(details[f"self_attention_cache_{i}"]["shape"], tf.float32)
                for i in range(self.runner.num_layers)]

    def static_decode_step(self, tokens, index, self_caches, cross_caches,
                           encoder_padding_mask):
        import tensorflow as tf

        caches, source = cross_caches
        inputs = {"token": np.asarray(tokens, np.int32),
                  "index": np.asarray(index, np.int32),
                  "source_ids": np.asarray(source)}
        for i in range(self.runner.num_layers):
            inputs[f"self_attention_cache_{i}"] = np.asarray(self_caches[i])
            inputs[f"cross_attention_cache_{i}"] = np.asarray(caches[i])
        out = self.runner._decode(**inputs)
        return tf.constant(out["logits"]), [
            tf.constant(out[f"self_attention_cache_{i}"])
            for i in range(self.runner.num_layers)]


class LiteRTTranslator:
    """Translates raw text with a ``.tflite`` from ``export_translator_litert``.

    The graph runs on the LiteRT interpreter (``ai_edge_litert``); the
    search is ``keras_trm.decoding.search``'s ``greedy_search`` /
    ``beam_search`` itself (``static_cache=True``), run eagerly on the
    host over the file's ``decode_step``, with the ``[START]`` / ``[END]``
    ids of the file's vocabulary. At most min(T + 50, max_length - 1)
    tokens are generated, T the width of the ids given (as for the
    searches on the same batch). Tokenization uses the vocabulary stored in the file with
    ``keras_trm.text.TextTokenizer`` (TensorFlow on the host: kept simple,
    not a device tokenizer). Sources longer than ``max_source_length - 1``
    subwords are truncated, as in ``decoding.Translator``.

    Args:
        path: the ``.tflite`` file.
        num_threads: int >= 1, interpreter threads.
        beam_size: int >= 1; 1 is greedy search. Must divide the file's
            ``batch_size``.
        length_penalty_alpha: α >= 0 of the length penalty.

    ``translate_texts(list of str) -> list of str``; ``translate_ids(int
    (n, T) source ids with END) -> list of int lists`` (generated ids,
    without START, END excluded).

    Raises:
        ValueError: bad argument (named with its value), or a file without
            the translator's signatures / metadata.
        FileNotFoundError: ``path`` does not exist.

    Example (a tiny untrained model; ``export_translator_litert`` shows
    more):

    >>> import tempfile, pathlib
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import RESERVED_TOKENS
    >>> vocab = list(RESERVED_TOKENS) + ["a", "b"]
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_length=6)
    >>> path = export_translator_litert(
    ...     model, pathlib.Path(tempfile.mkdtemp()) / "t.tflite", vocab,
    ...     batch_size=1)
    >>> len(LiteRTTranslator(path, beam_size=1).translate_texts(["a b"]))
    1
    """

    def __init__(self, path, num_threads=2, beam_size=4,
                 length_penalty_alpha=0.6):
        import json

        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"`path` {str(path)!r} does not exist")
        _check_int_at_least_1("num_threads", num_threads)
        _check_int_at_least_1("beam_size", beam_size)
        if not float(length_penalty_alpha) >= 0:
            raise ValueError("`length_penalty_alpha` must be >= 0, got "
                             f"length_penalty_alpha={length_penalty_alpha!r}")
        metadata = read_litert_metadata(path)
        if _CONFIG_KEY not in metadata or _VOCABULARY_KEY not in metadata:
            raise ValueError(f"{str(path)!r} was not written by "
                             "export_translator_litert (no translator metadata)")
        self.config = json.loads(metadata[_CONFIG_KEY].decode("utf-8"))
        self.vocabulary = metadata[_VOCABULARY_KEY].decode("utf-8").split("\n")[:-1]
        # The special ids, from the file's own vocabulary (the tokenizer's
        # [START] / [END]); padding is id 0, the model's mask convention.
        from keras_trm.text.wordpiece import END, START

        missing = [t for t in (START, END) if t not in self.vocabulary]
        if missing:
            raise ValueError(f"{str(path)!r}: the vocabulary in the file has no "
                             f"{' / '.join(missing)} token")
        self.start_id = self.vocabulary.index(START)
        self.end_id = self.vocabulary.index(END)
        self.batch_size = int(self.config["batch_size"])
        if self.batch_size % beam_size:
            raise ValueError(f"`beam_size` must divide the file's batch_size "
                             f"{self.batch_size}, got beam_size={beam_size}")
        self.path = path
        self.beam_size = beam_size
        self.length_penalty_alpha = float(length_penalty_alpha)
        self.num_layers = int(self.config["num_layers"])
        self.max_length = int(self.config["max_length"])
        self.max_source_length = int(self.config["max_source_length"])
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:  # pragma: no cover
            import tensorflow as tf

            Interpreter = tf.lite.Interpreter
        self.interpreter = Interpreter(model_path=str(path),
                                       num_threads=num_threads)
        self.signatures = self.interpreter.get_signature_list()
        self._encode = self.interpreter.get_signature_runner("encode")
        self._decode = self.interpreter.get_signature_runner("decode_step")
        self._tokenizer = None

    # -- ids ---------------------------------------------------------------

    def _search(self, block):
        """(rows of the file's batch / k, T) source ids -> (rows, steps) ids."""
        import tensorflow as tf

        from keras_trm.decoding.search import beam_search, greedy_search

        model = _LiteRTModel(self)
        block = tf.constant(block)
        if self.beam_size == 1:
            ids = greedy_search(model, block, static_cache=True,
                                start_id=self.start_id, end_id=self.end_id)
        else:
            ids = beam_search(model, block, beam_size=self.beam_size,
                              length_penalty_alpha=self.length_penalty_alpha,
                              static_cache=True, start_id=self.start_id,
                              end_id=self.end_id)
        return ids.numpy()

    def translate_ids(self, source_ids):
        """int ``(n, T)`` source ids (END included, 0-padded, T <=
        ``max_source_length``) -> list of n lists of generated ids (END and
        what follows dropped)."""
        source_ids = np.asarray(source_ids)
        if source_ids.ndim != 2 or source_ids.shape[1] > self.max_source_length:
            raise ValueError(
                "`source_ids` must have shape (n, T <= "
                f"{self.max_source_length}), got shape {source_ids.shape}")
        padded = source_ids.astype(np.int32)
        per_call = self.batch_size // self.beam_size
        results = []
        for start in range(0, len(padded), per_call):
            block = padded[start:start + per_call]
            real = len(block)
            if real < per_call:  # fill with one-token sources ([END])
                filler = np.zeros((per_call - real, padded.shape[1]), np.int32)
                filler[:, 0] = self.end_id
                block = np.concatenate([block, filler])
            ids = self._search(block)
            for row in ids[:real]:
                row = row.tolist()
                results.append(row[:row.index(self.end_id)]
                               if self.end_id in row else
                               [t for t in row if t != 0])
        return results

    # -- text --------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from keras_trm.text.wordpiece import TextTokenizer

            self._tokenizer = TextTokenizer(self.vocabulary)
        return self._tokenizer

    def encode_texts(self, sentences):
        """list of str -> int32 (n, T) ids + END, 0-padded (as
        ``decoding.Translator.encode_text``)."""
        ids = self.tokenizer.tokenize(list(sentences)).to_list()
        ids = [row[:self.max_source_length - 1] + [self.end_id] for row in ids]
        out = np.zeros((len(ids), max(map(len, ids), default=1)), np.int32)
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
