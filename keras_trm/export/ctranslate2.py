"""CTranslate2 export of a ``keras_trm.models.transformer()`` model.

Maps a trained model onto the ``TransformerSpec`` of CTranslate2
(https://opennmt.net/CTranslate2, a C++ inference engine) through its
converter API, and gives ``CTranslate2Translator``: our WordPiece
(de)tokenization around ``ctranslate2.Translator.translate_batch``, raw text
in and text out, as ``keras_trm.decoding.Translator``.

The mapping (weights copied, not retrained), keras_trm -> ``TransformerSpec``:

- token table x sqrt(d_model) -> ``embeddings.weight``, ``scale_embeddings``;
- our sinusoid table (interleaved sin/cos, §3.5) or learned positions ->
  ``position_encodings.encodings``, as the model computes them (CT2's own
  table is concatenated);
- query/key/value kernels (d, h, d_k) -> ``self_attention.linear[0]``, one
  fused (3·d, d) QKV matrix (cross-attention: ``linear[0]`` = Q,
  ``linear[1]`` = fused KV); output kernel (h, d_k, d) -> ``linear[-1]``;
- post-LN -> ``pre_norm=False``; pre-LN -> ``pre_norm=True`` + final norms;
- ReLU FFN -> ``ffn.linear_0`` / ``ffn.linear_1``; tied output projection
  h·Eᵀ -> ``decoder.projection.weight`` = E (stored once, as an alias);
- [UNK] [START] [END] -> ``unk_token``, ``bos_token`` =
  ``decoder_start_token``, ``eos_token``; ``add_source_eos`` (our source is
  ids + END).

Length penalty: our beam search divides log-probabilities by the GNMT
penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, Eq. 14), CTranslate2
by length ** alpha, so beam-search BLEU can differ a little (Multi30k
test_2016_flickr, beam 4, alpha 0.6: 38.10 ours vs 38.01, 95% of sentences
identical); greedy search gave the same output on all 1,000 sentences
(``bench/results/decoding.json``).

``ctranslate2`` is optional (``pip install -e ".[ctranslate2]"``), imported
when a function here is called.
"""

import json
import logging
import os
import pathlib
import platform

import numpy as np
import tensorflow as tf

from keras_trm.text.wordpiece import TextTokenizer, load_vocabulary
from keras_trm.utils.checks import RenamedAttributes
from keras_trm.utils.files import atomic_directory
from keras_trm.utils.ids import END, END_ID, PAD_ID, RESERVED_TOKENS, START, UNK

_LOG = logging.getLogger(__name__)

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16",
                 "bfloat16", "int8_float16", "int8_bfloat16")
METADATA_FILE = "keras_trm.json"


def _import_ctranslate2():
    try:
        import ctranslate2
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError(
            "keras_trm.export.ctranslate2 needs the `ctranslate2` package: "
            'pip install -e ".[ctranslate2]" (or pip install "ctranslate2>=4.0")'
        ) from err
    return ctranslate2


# -- reading the keras model --------------------------------------------------


def _numpy(variable):
    return np.asarray(variable.numpy() if hasattr(variable, "numpy")
                      else variable, dtype=np.float32)


def _check_supported(model):
    """Raises ValueError naming anything our TransformerSpec mapping cannot
    express."""
    import keras

    from keras_trm.layers.multi_head_attention import MultiHeadAttention
    from keras_trm.layers.positional_embedding import PositionalEmbedding

    if not model.encoder_layers or not model.decoder_layers:
        raise ValueError("`model` has no encoder_layer_0/decoder_layer_0: it is "
                         "not a keras_trm.models.transformer() encoder-decoder")
    if len(model.encoder_layers) != len(model.decoder_layers):
        # CT2 accepts different depths, but our builder never makes them.
        raise ValueError(
            f"`model` has {len(model.encoder_layers)} encoder and "
            f"{len(model.decoder_layers)} decoder layers; "
            "keras_trm.models.transformer() builds equal stacks")
    for emb in (model.source_embedding, model.target_embedding):
        if not isinstance(emb, PositionalEmbedding):
            raise ValueError(f"layer {emb.name!r} is {type(emb).__name__}, "
                             "expected keras_trm PositionalEmbedding")
    blocks = model.encoder_layers + model.decoder_layers
    norm_first = {block.norm_first for block in blocks}
    if len(norm_first) != 1:
        raise ValueError("`model` mixes pre-LN and post-LN blocks "
                         f"(norm_first values {sorted(norm_first)})")
    final_norms = [n for n in (model.encoder_final_norm, model.decoder_final_norm)
                   if n is not None]
    if norm_first == {True} and len(final_norms) != 2:
        raise ValueError("pre-LN `model` without encoder_final_norm/"
                         "decoder_final_norm is not supported")
    epsilons = {float(block.layer_norm_epsilon) for block in blocks}
    epsilons |= {float(norm.epsilon) for norm in final_norms}
    if len(epsilons) != 1:
        raise ValueError("CTranslate2 has one layer_norm_epsilon per model, "
                         f"`model` uses {sorted(epsilons)}")
    for block in blocks:
        name = str(keras.activations.serialize(block.activation))
        if "relu" not in name or "leaky" in name:
            raise ValueError(f"layer {block.name!r} uses FFN activation {name!r}; "
                             "only 'relu' (the paper's FFN, Eq. 2) is supported")
        for att in (block.self_attention, getattr(block, "cross_attention", None)):
            if att is None:
                continue
            where = f"attention {att.name!r} of {block.name!r}"
            if not isinstance(att, MultiHeadAttention):
                raise ValueError(f"{where} is not keras_trm MultiHeadAttention")
            if att.value_dim != att.key_dim:
                raise ValueError(f"{where} has value_dim={att.value_dim} != "
                                 f"key_dim={att.key_dim}")
            if att.num_heads != model.num_heads:
                raise ValueError(f"{where} has {att.num_heads} heads, others "
                                 f"{model.num_heads}: CTranslate2 uses one "
                                 "num_heads per model")
            if (att.output_dense.kernel.shape[-1]
                    != att.query_dense.kernel.shape[0]):
                raise ValueError(f"{where} has an output_shape other than d_model")
        for norm in ("self_attention_norm", "cross_attention_norm", "ffn_norm"):
            norm = getattr(block, norm, None)
            if norm is not None and not (norm.center and norm.scale):
                raise ValueError(f"LayerNormalization {norm.name!r} without "
                                 "center/scale is not supported")


# -- filling the spec -----------------------------------------------------------


def _set_linear(spec, kernel, bias):
    """keras (in, out) kernel -> CT2 (out, in) weight."""
    spec.weight = np.ascontiguousarray(_numpy(kernel).T)
    if bias is not None:
        spec.bias = _numpy(bias)


def _set_attention(spec, attention, self_attention):
    """(d, h, d_k) Q/K/V kernels -> CT2's fused (d, h*d_k) blocks: linear[0]
    = QKV for self-attention; Q (decoder side) and linear[1] = KV (encoder
    side) for cross-attention."""
    denses = (attention.query_dense, attention.key_dense, attention.value_dense)
    kernels = [_numpy(x.kernel).reshape(x.kernel.shape[0], -1) for x in denses]
    biases = [None if x.bias is None else _numpy(x.bias).reshape(-1)
              for x in denses]
    groups = [(0, 3)] if self_attention else [(0, 1), (1, 3)]
    for linear, (a, b) in zip(spec.linear, groups):
        _set_linear(linear, np.concatenate(kernels[a:b], axis=-1),
                    None if biases[0] is None else np.concatenate(biases[a:b]))
    out = attention.output_dense
    h, d_k, d = out.kernel.shape
    _set_linear(spec.linear[-1], _numpy(out.kernel).reshape(h * d_k, d), out.bias)


def _set_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_embedding_and_positions(stack_spec, embeddings_spec, embedding):
    embeddings_spec.weight = _numpy(embedding.embeddings)
    stack_spec.scale_embeddings = bool(embedding.scale_embeddings)
    if embedding.position == "sinusoidal":
        table = np.asarray(embedding._pe, dtype=np.float32)
    else:
        table = _numpy(embedding.position_embeddings)
    stack_spec.position_encodings.encodings = table


# Instruction-set caps (as MKL, oneDNN and CTranslate2 spell them) without
# VNNI, and the variables that set them (CTranslate2 runs MKL on Intel CPUs,
# oneDNN elsewhere; CT2_FORCE_CPU_ISA caps its own kernels).
_NO_VNNI_LEVELS = {"SSE4_2", "SSE41", "AVX", "AVX2", "AVX512", "AVX512_CORE",
                   "AVX512_MIC", "AVX512_MIC_4OPS"}
_VNNI_CPU_FLAGS = {"avx512_vnni", "avx_vnni", "amx_int8"}
_ISA_CAP_VARIABLES = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                      "DNNL_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA")


def cpu_has_int8_dot_product(cpuinfo="/proc/cpuinfo"):
    """Whether CTranslate2's int8 matrix products are exact on this CPU.

    On x86, CTranslate2 multiplies int8 weights by uint8-shifted
    activations (MKL's ``cblas_gemm_s8u8s32`` or oneDNN), summed in int32
    with VNNI or AMX. Without (AVX2, AVX-512 without VNNI) pairs of products
    are first summed in int16 with saturation (``vpmaddubsw``: 2 x 255 x 127
    overflows 32,767), which changes most greedy outputs of a small Multi30k
    model (``tests/test_ctranslate2.py``). ``MKL_ENABLE_INSTRUCTIONS``,
    ``ONEDNN_MAX_CPU_ISA``, ``DNNL_MAX_CPU_ISA`` or ``CT2_FORCE_CPU_ISA`` set
    to ``AVX2`` (or lower) gives an AVX2 host's answer.

    Args:
        cpuinfo: path of the Linux CPU description to read the flags from.

    Returns:
        bool. ``True`` off x86 (ARM builds use Ruy, which has no such
        saturation) and when the flags cannot be read.
    """
    if any(os.environ.get(var, "").strip().upper() in _NO_VNNI_LEVELS
           for var in _ISA_CAP_VARIABLES):
        return False
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    try:
        text = pathlib.Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    flags = [line.split(":", 1)[-1].split() for line in text.splitlines()
             if line.startswith("flags")]
    return not flags or bool(_VNNI_CPU_FLAGS & set(flags[0]))


def default_compute_type(quantization, device="cpu", supported=None):
    """The compute type ``CTranslate2Translator`` uses for ``"default"``.

    The type the weights were saved in, except for int8 weights on an x86
    CPU without an int8 dot product (``cpu_has_int8_dot_product``), where
    CTranslate2's int8 GEMM saturates. Those run as ``"int16"`` where
    CTranslate2 offers it (MKL, on Intel CPUs), else as ``"float32"``
    (oneDNN has no int16 GEMM): the weights widened or dequantized at load.

    Args:
        quantization: the export's ``quantization`` (``keras_trm.json``).
        device: ``"cpu"`` or ``"cuda"``.
        supported: the compute types CTranslate2 offers on ``device``
            (default: asked ``ctranslate2`` when needed).

    Returns:
        str, a CTranslate2 compute type.

    Example:

    >>> default_compute_type("float32")
    'default'
    >>> default_compute_type("int8", device="cuda")
    'default'
    """
    if (device == "cpu" and str(quantization).startswith("int8")
            and not cpu_has_int8_dot_product()):
        if supported is None:
            supported = _import_ctranslate2().get_supported_compute_types(device)
        return "int16" if "int16" in supported else "float32"
    return "default"


def build_spec(model, vocabulary):
    """Builds a ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights.

    Args:
        model: a ``keras_trm.models.transformer()`` model (post- or pre-LN,
            tied or not, sinusoidal or learned positions, ReLU FFN).
        vocabulary: list of str, the model's shared vocabulary,
            ``RESERVED_TOKENS`` first, of the model's vocabulary size.

    Returns:
        a validated ``TransformerSpec`` (not yet quantized or saved).

    Raises:
        ValueError: not a keras_trm transformer, something the spec cannot
            express (named), or a vocabulary that does not match.
        ImportError: ``ctranslate2`` is not installed.

    Example:

    >>> from keras_trm.models import transformer
    >>> vocab = ["[PAD]", "[UNK]", "[START]", "[END]"] + list("abcdef")
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_sequence_length=16)
    >>> spec = build_spec(model, vocab)
    >>> spec.decoder.position_encodings.encodings.shape
    (16, 8)
    >>> spec.config.decoder_start_token, spec.config.eos_token
    ('[START]', '[END]')
    """
    ctranslate2 = _import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    from keras_trm.models.transformer import as_transformer

    model = as_transformer(model)  # ValueError if not a transformer()
    _check_supported(model)
    vocabulary = list(vocabulary)
    if tuple(vocabulary[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
        raise ValueError(f"`vocabulary` must start with {RESERVED_TOKENS}, got "
                         f"{tuple(vocabulary[:len(RESERVED_TOKENS)])}")
    if len(set(vocabulary)) != len(vocabulary):
        raise ValueError("`vocabulary` has duplicate tokens; CTranslate2 "
                         "maps tokens to ids by string")
    for side, size in (("source", model.source_embedding.vocabulary_size),
                       ("target", model.target_vocabulary_size)):
        if size != len(vocabulary):
            raise ValueError(f"`vocabulary` has {len(vocabulary)} tokens but the "
                             f"model's {side} vocabulary has {size}")

    pre_norm = bool(model.encoder_layers[0].norm_first)
    spec = transformer_spec.TransformerSpec.from_config(
        len(model.encoder_layers), model.num_heads, pre_norm=pre_norm,
        activation=ctranslate2.specs.Activation.RELU,
    )
    _set_embedding_and_positions(spec.encoder, spec.encoder.embeddings[0],
                                 model.source_embedding)
    _set_embedding_and_positions(spec.decoder, spec.decoder.embeddings,
                                 model.target_embedding)
    for layer_spec, block in zip([*spec.encoder.layer, *spec.decoder.layer],
                                 model.encoder_layers + model.decoder_layers):
        _set_attention(layer_spec.self_attention, block.self_attention, True)
        _set_norm(layer_spec.self_attention.layer_norm, block.self_attention_norm)
        if hasattr(block, "cross_attention"):
            _set_attention(layer_spec.attention, block.cross_attention, False)
            _set_norm(layer_spec.attention.layer_norm, block.cross_attention_norm)
        _set_norm(layer_spec.ffn.layer_norm, block.ffn_norm)
        _set_linear(layer_spec.ffn.linear_0, block.ffn_inner.kernel, block.ffn_inner.bias)
        _set_linear(layer_spec.ffn.linear_1, block.ffn_outer.kernel, block.ffn_outer.bias)
    if pre_norm:
        _set_norm(spec.encoder.layer_norm, model.encoder_final_norm)
        _set_norm(spec.decoder.layer_norm, model.decoder_final_norm)
    if model.output_projection is None:  # tied: logits = h · Eᵀ
        spec.decoder.projection.weight = _numpy(model.target_embedding.embeddings)
    else:
        _set_linear(spec.decoder.projection, model.output_projection.kernel,
                    model.output_projection.bias)

    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.unk_token = UNK
    spec.config.bos_token = START
    spec.config.eos_token = END
    spec.config.decoder_start_token = START
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True  # our encoder input is ids + [END]
    spec.config.layer_norm_epsilon = float(
        model.encoder_layers[0].layer_norm_epsilon)
    spec.validate()
    return spec


def ctranslate2_converter(model, vocabulary):
    """A ``ctranslate2.converters.Converter`` for a keras_trm transformer.

    Its ``_load()`` is ``build_spec(model, vocabulary)``, so CTranslate2's
    ``convert(output_dir, quantization=..., force=...)`` validates,
    quantizes and saves the spec in place (``export_ctranslate2`` adds the
    atomic write and our ``keras_trm.json``). The class is made on call
    because ``ctranslate2`` is an optional dependency.

    Args:
        model, vocabulary: as ``build_spec``.

    Returns:
        a ``ctranslate2.converters.Converter`` instance.

    Raises:
        ImportError: ``ctranslate2`` is not installed.

    Example:

    >>> import ctranslate2
    >>> from keras_trm.models import transformer
    >>> vocab = ["[PAD]", "[UNK]", "[START]", "[END]"] + list("abcdef")
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_sequence_length=16)
    >>> isinstance(ctranslate2_converter(model, vocab), ctranslate2.converters.Converter)
    True
    """
    ctranslate2 = _import_ctranslate2()

    class KerasTrmConverter(ctranslate2.converters.Converter):
        def __init__(self, model, vocabulary):
            self.model = model
            self.vocabulary = list(vocabulary)

        def _load(self):
            return build_spec(self.model, self.vocabulary)

    return KerasTrmConverter(model, vocabulary)


def export_ctranslate2(model, output_dir, vocabulary, quantization="float32"):
    """Writes ``model`` as a CTranslate2 model directory, atomically.

    The directory holds CTranslate2's ``model.bin``, ``config.json`` and
    ``shared_vocabulary.json`` (our tokens, ids unchanged), plus
    ``keras_trm.json``: the position limits and reserved tokens that
    ``CTranslate2Translator`` reads.

    Args:
        model: a ``keras_trm.models.transformer()`` model (see
            ``build_spec`` for what is supported).
        output_dir: str or path; must not exist. Written beside it and
            renamed into place when complete.
        vocabulary: list of str tokens, or the path of a vocabulary file
            (one token a line, as ``keras_trm.text.save_vocabulary`` writes).
        quantization: weight type on disk: ``"float32"`` (default) or
            ``"int8"`` (8-bit weights, per-row scales; also ``"int16"``,
            ``"float16"``, ``"bfloat16"``, ``"int8_float32"``, ...).

    Returns:
        ``pathlib.Path`` of ``output_dir``.

    Raises:
        FileExistsError: ``output_dir`` exists.
        ValueError: as ``build_spec``, or a bad ``quantization``.
        ImportError: ``ctranslate2`` is not installed.

    Source: CTranslate2's ``TransformerSpec`` and conversion guide
    (https://opennmt.net/CTranslate2/guides/transformers.html).

    Example:

    >>> import tempfile, pathlib
    >>> from keras_trm.models import transformer
    >>> vocab = ["[PAD]", "[UNK]", "[START]", "[END]"] + list("abcdef")
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_sequence_length=16)
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "ct2"
    >>> path = export_ctranslate2(model, out, vocab, quantization="int8")
    >>> sorted(p.name for p in path.iterdir())
    ['config.json', 'keras_trm.json', 'model.bin', 'shared_vocabulary.json']
    """
    _import_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"`quantization` must be one of {QUANTIZATIONS}, got "
                         f"quantization={quantization!r}")
    output_dir = pathlib.Path(output_dir)
    if output_dir.exists():
        raise FileExistsError(f"`output_dir` {str(output_dir)!r} already exists")
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = load_vocabulary(vocabulary)
    converter = ctranslate2_converter(model, vocabulary)
    with atomic_directory(output_dir) as tmp:
        converter.convert(str(tmp), quantization=quantization, force=True)
        from keras_trm.models.transformer import as_transformer

        model = as_transformer(model)
        metadata = {
            "format": "keras_trm CTranslate2 export",
            "model_name": model.name,
            "max_sequence_length": int(model.max_sequence_length),
            "source_max_sequence_length": int(
                model.source_embedding.max_sequence_length),
            "quantization": quantization,
            "reserved_tokens": list(RESERVED_TOKENS),
            "pad_id": PAD_ID,
            "end_id": END_ID,
            "tokenizer": "keras_trm.text.TextTokenizer (WordPiece, cased)",
            "length_penalty": "CTranslate2 divides by length ** alpha; "
                              "keras_trm beam search by ((5 + length) / 6) ** alpha",
        }
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=1),
                                         encoding="utf-8")
    return output_dir


def load_exported_vocabulary(model_dir):
    """The token list (id order) of an ``export_ctranslate2`` directory
    (CTranslate2's ``shared_vocabulary.json``).

    Raises:
        FileNotFoundError: no vocabulary file in ``model_dir``.

    Example: ``load_exported_vocabulary(path)[:4]`` is
    ``['[PAD]', '[UNK]', '[START]', '[END]']``.
    """
    model_dir = pathlib.Path(model_dir)
    for name in ("shared_vocabulary.json", "target_vocabulary.json"):
        path = model_dir / name
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    raise FileNotFoundError(f"no shared_vocabulary.json in {str(model_dir)!r}")


class CTranslate2Translator(RenamedAttributes):
    """Raw text -> text with a directory written by ``export_ctranslate2``.

    Tokenizes with our WordPiece ``TextTokenizer`` (the exported
    vocabulary), translates with ``ctranslate2.Translator.translate_batch``
    and detokenizes as ``keras_trm.decoding.Translator``, so outputs (and
    BLEU) compare one to one. Settings mirror ours: sources truncated to
    ``max_sequence_length - 1`` tokens + [END]; at most
    ``min(T_src + 50, max_sequence_length - 1)`` generated tokens, T_src the
    sentence's own source length with END (CTranslate2 decodes the batch to
    its longest limit, each output is cut to its own: exact for greedy
    search); an empty sentence gives "".

    Args:
        model_dir: an ``export_ctranslate2`` directory.
        num_threads: int >= 1, CTranslate2 ``intra_threads``: threads
            per batch.
        inter_threads: int >= 1, CTranslate2 ``inter_threads``: with n > 1
            each ``translate_tokens`` batch is split into n parts decoded
            in parallel, n x ``num_threads`` threads in all (as
            ``Translator``'s ``parallel_searches``).
        device: ``"cpu"`` or ``"cuda"``.
        compute_type: CTranslate2 compute type, passed as it is, except
            ``"default"``: ``default_compute_type`` (int8 weights on an x86
            CPU without VNNI run as int16 or float32; the choice is logged
            and kept in ``self.compute_type``).

    Threads: CTranslate2's OpenMP (libgomp) threads spin while waiting,
    fastest on an idle machine with one translator per process (libgomp
    stops spinning when threads outnumber cores). On a machine shared with
    busy processes set ``OMP_WAIT_POLICY=PASSIVE`` before importing
    ``ctranslate2`` (2 spinning threads measured 20x slower than 1 on a
    loaded 2-core machine; ``bench/bench_decoding.py``'s notes, 32da1ca).

    Raises:
        FileNotFoundError: ``model_dir`` is not an export directory.
        ValueError: ``num_threads`` or ``inter_threads`` < 1.

    Example:

    >>> import tempfile, pathlib
    >>> from keras_trm.models import transformer
    >>> vocab = ["[PAD]", "[UNK]", "[START]", "[END]"] + list("abcdef")
    >>> model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
    ...                     d_ff=16, max_sequence_length=16)
    >>> out = export_ctranslate2(
    ...     model, pathlib.Path(tempfile.mkdtemp()) / "ct2", vocab)
    >>> translator = CTranslate2Translator(out, num_threads=1)
    >>> hyps = translator.translate_texts(["a b c", ""], beam_size=2)
    >>> len(hyps), hyps[1]
    (2, '')
    """

    RENAMED_ATTRIBUTES = {"max_length": "max_sequence_length",
                          "source_max_length": "source_max_sequence_length"}

    def __init__(self, model_dir, num_threads=2, device="cpu",
                 compute_type="default", inter_threads=1):
        ctranslate2 = _import_ctranslate2()
        self.model_dir = pathlib.Path(model_dir)
        meta_path = self.model_dir / METADATA_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"`model_dir` {str(self.model_dir)!r} has no "
                                    f"{METADATA_FILE}: not a keras_trm.export.ctranslate2 export")
        for name, value in (("num_threads", num_threads),
                            ("inter_threads", inter_threads)):
            if int(value) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {name}={value}")
        self.inter_threads = int(inter_threads)
        self.metadata = meta = json.loads(meta_path.read_text(encoding="utf-8"))
        self.vocabulary = load_exported_vocabulary(self.model_dir)
        self.token_ids = {token: i for i, token in enumerate(self.vocabulary)}
        self.tokenizer = TextTokenizer(self.vocabulary)
        # Exports before the rename say ``max_length``, ``source_max_length``.
        self.max_sequence_length = int(meta.get("max_sequence_length",
                                                meta.get("max_length")))
        self.source_max_sequence_length = int(meta.get(
            "source_max_sequence_length",
            meta.get("source_max_length", self.max_sequence_length)))
        if compute_type == "default":
            compute_type = default_compute_type(
                meta.get("quantization", "float32"), device)
            if compute_type != "default":
                _LOG.info("%s: int8 weights run as %s on this CPU (no int8 "
                          "dot product: CTranslate2's int8 GEMM would saturate)",
                          self.model_dir, compute_type)
        self.compute_type = compute_type
        self.translator = ctranslate2.Translator(
            str(self.model_dir), device=device, compute_type=compute_type,
            inter_threads=self.inter_threads, intra_threads=int(num_threads))

    def tokenize(self, sentences):
        """list of str -> list of token-string lists (no [END]: CT2 adds it)."""
        if not sentences:
            return []
        ids = self.tokenizer.tokenize(tf.constant(list(sentences))).to_list()
        limit = self.source_max_sequence_length - 1
        return [[self.vocabulary[i] for i in row[:limit]] for row in ids]

    def detokenize(self, token_lists):
        """list of token-string lists -> list of str (our detokenizer)."""
        if not token_lists:
            return []
        ids = tf.ragged.constant([[self.token_ids[t] for t in tokens]
                                  for tokens in token_lists], tf.int32, ragged_rank=1)
        return [s.decode("utf-8") for s in self.tokenizer.detokenize(ids).numpy()]

    def translate_tokens(self, token_lists, beam_size=4, length_penalty=0.6,
                         max_decoding_length=None, min_decoding_length=0):
        """One batch of source token lists -> target token lists.

        By default each sentence may have its own source length (+ END) +
        50 tokens, as in our searches; an int ``max_decoding_length`` is
        every sentence's limit instead. ``min_decoding_length``: no END
        before that many tokens (equal to ``max_decoding_length``: exactly
        that many steps).

        Raises:
            ValueError: ``max_decoding_length`` not in [1,
                max_sequence_length - 1], ``min_decoding_length`` not in [0, it].
        """
        if not token_lists:
            return []
        cap = self.max_sequence_length - 1
        if max_decoding_length is None:
            limits = [min(len(t) + 1 + 50, cap) for t in token_lists]
        else:
            if not 1 <= int(max_decoding_length) <= cap:
                raise ValueError(f"`max_decoding_length` must be in [1, {cap}], got "
                                 f"max_decoding_length={max_decoding_length}")
            limits = [int(max_decoding_length)] * len(token_lists)
        if not 0 <= int(min_decoding_length) <= max(limits):
            raise ValueError(f"`min_decoding_length` must be in [0, {max(limits)}], "
                             f"got min_decoding_length={min_decoding_length}")
        split = {}
        if self.inter_threads > 1:  # parts decoded at once, one per replica
            split["max_batch_size"] = -(-len(token_lists) // self.inter_threads)
        # CTranslate2 takes one limit per batch; each row is cut to its own.
        results = self.translator.translate_batch(
            token_lists, beam_size=int(beam_size),
            length_penalty=float(length_penalty),
            max_decoding_length=max(limits),
            min_decoding_length=int(min_decoding_length),
            max_input_length=0, **split,
        )
        return [r.hypotheses[0][:limit] for r, limit in zip(results, limits)]

    def translate_texts(self, sentences, beam_size=4, length_penalty=0.6,
                        max_batch_size=100):
        """list of str -> list of str, ``max_batch_size`` sentences a batch.
        ``length_penalty`` is CT2's alpha (score / length ** alpha), not GNMT's."""
        if int(beam_size) < 1:
            raise ValueError(f"`beam_size` must be >= 1, got beam_size={beam_size}")
        if int(max_batch_size) < 1:
            raise ValueError("`max_batch_size` must be >= 1, got "
                             f"max_batch_size={max_batch_size}")
        sentences = list(sentences)
        out = []
        for start in range(0, len(sentences), int(max_batch_size)):
            batch = sentences[start:start + int(max_batch_size)]
            tokens = self.tokenize(batch)
            hyps = self.translate_tokens(tokens, beam_size, length_penalty)
            texts = self.detokenize(hyps)
            out.extend("" if not s.strip() else t for s, t in zip(batch, texts))
        return out
