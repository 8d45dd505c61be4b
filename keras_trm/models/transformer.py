"""The encoder-decoder Transformer of Vaswani et al. (2017) as a functional model.

``transformer(...)`` is the one general builder; the presets are thin calls
of it with the paper's hyper-parameters (Table 3):

=====================  ===  =======  ====  ==  =======  =============
preset                 N    d_model  d_ff  h   dropout  params (37k)
=====================  ===  =======  ====  ==  =======  =============
transformer_base       6    512      2048  8   0.1      ~63M (65M)
transformer_big        6    1024     4096  16  0.3      ~214M (213M)
transformer_small      3    256      1024  4   0.1      CPU preset
=====================  ===  =======  ====  ==  =======  =============
"""

import numbers

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.models.functional import IntegerInputsModel, check_stack
from keras_trm.layers.positional_embedding import PositionalEmbedding
from keras_trm.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock

TIE_MODES = {"all", "decoder", "none"}


@keras.saving.register_keras_serializable(package="keras_trm")
class Transformer(v.RenamedAttributes, IntegerInputsModel):
    """The encoder-decoder Transformer: a functional model that decodes.

    Architecture (Vaswani et al. 2017, §3, Figure 1): token embedding x
    sqrt(d_model) + position encoding, dropout (§5.4); ``num_layers``
    encoder blocks over the source; ``num_layers`` decoder blocks over the
    shifted target with causal self-attention and attention over the
    encoder output; a linear projection to the vocabulary (softmax is left
    to the loss). With ``tie_embeddings="all"`` source embedding, target
    embedding and output projection are one matrix (§3.4, shared
    vocabulary); ``"decoder"`` ties only the target side (needs
    ``target_vocabulary_size``); ``"none"`` ties nothing.

    Called on ``{"encoder_tokens", "decoder_tokens"}`` it is the teacher-forced
    model that ``fit`` trains. For decoding it exposes the same computation
    in pieces, built from its own layers (keras-hub's ``call_with_cache``
    pattern; ``keras_trm.decoding.DecodingModel``): ``encode`` runs the
    encoder once; ``cross_attention_caches`` projects its output into each
    decoder layer's keys/values once; ``decode_step`` runs the decoder for
    one position over per-layer self-attention caches (``empty_caches``),
    fixed-size (static shapes, for XLA) or growing by one position per
    step. ``keras_trm.decoding``'s searches take the model itself.

    Args:
        vocabulary_size: int, the (source, or shared) vocabulary size; id 0
            is padding.
        num_layers: N, encoder and decoder layers each.
        d_model, num_heads, d_ff: model width, heads (must divide d_model),
            FFN inner width.
        dropout_rate: residual and embedding dropout P_drop.
        attention_dropout_rate: dropout on attention probabilities.
        max_sequence_length: the positions of the embeddings' tables: the
            longest source or target sequence (tokens, START/END included).
            ``max_length``: its old name, deprecated (a config saved with
            it still loads).
        position: ``"sinusoidal"`` (paper) or ``"learned"``.
        tie_embeddings: ``"all"``, ``"decoder"`` or ``"none"``.
        target_vocabulary_size: int; target vocabulary when not shared.
        norm_first: pre-LN blocks (plus a final LayerNorm per stack).
        layer_norm_epsilon: float.
        dtype: the layers' dtype policy (default: the global policy, e.g.
            ``"mixed_bfloat16"``); logits are float32 either way.
        name: the model's name.

    Inputs / outputs: ``{"encoder_tokens": int32 (batch, T_src),
    "decoder_tokens": int32 (batch, T_tgt)}`` -> float32 logits
    ``(batch, T_tgt, target vocabulary)``.

    Raises:
        ValueError: ``d_model`` not divisible by ``num_heads``; a bad
            ``tie_embeddings``; a shared tie with two vocabulary sizes; a
            rate outside [0, 1) or a ``layer_norm_epsilon`` not a finite
            float > 0 (both when built); ``decode_step`` given caches for
            another number of layers, or a host ``index`` the caches do not
            match.
        TypeError: called on float or bool token ids (a plain functional
            model would cut them down to integers silently).

    Example:

    >>> import numpy as np
    >>> model = Transformer(vocabulary_size=20, num_layers=1, d_model=8,
    ...                     num_heads=2, d_ff=8, max_sequence_length=8)
    >>> src = np.array([[5, 6, 3]], "int32")
    >>> enc = model.encode(src)
    >>> cross = model.cross_attention_caches(enc)
    >>> caches = model.empty_caches(1, 0, enc.dtype)   # growing caches
    >>> logits, caches = model.decode_step(
    ...     np.array([[2]], "int32"), 0, caches, cross, src != 0, grow=True)
    >>> tuple(logits.shape), tuple(caches[0][0].shape)   # (batch, h, 1, d_k)
    ((1, 20), (1, 2, 1, 4))
    >>> full = model({"encoder_tokens": src,
    ...               "decoder_tokens": np.array([[2]], "int32")})
    >>> bool(np.allclose(full[:, 0], logits, atol=1e-5))
    True
    """

    RENAMED_ATTRIBUTES = {"max_length": "max_sequence_length"}

    def __init__(
        self,
        vocabulary_size,
        num_layers=6,
        d_model=512,
        num_heads=8,
        d_ff=2048,
        dropout_rate=0.1,
        attention_dropout_rate=0.0,
        max_sequence_length=256,
        position="sinusoidal",
        tie_embeddings="all",
        target_vocabulary_size=None,
        norm_first=False,
        layer_norm_epsilon=1e-6,
        dtype=None,
        name="transformer",
        max_length=None,
        **kwargs,
    ):
        max_sequence_length = v.renamed("max_length", max_length,
                                        "max_sequence_length",
                                        max_sequence_length)
        check_stack(vocabulary_size, num_layers, d_model, num_heads, dropout_rate,
                    attention_dropout_rate, layer_norm_epsilon)
        v.one_of("tie_embeddings", tie_embeddings, TIE_MODES)
        if target_vocabulary_size is None:
            target_vocabulary_size = vocabulary_size
        v.positive_int("target_vocabulary_size", target_vocabulary_size)
        if tie_embeddings == "all" and target_vocabulary_size != vocabulary_size:
            raise ValueError(
                "tie_embeddings='all' needs one shared vocabulary, got "
                f"vocabulary_size={vocabulary_size} and "
                f"target_vocabulary_size={target_vocabulary_size}"
            )
        policy = keras.dtype_policies.get(dtype or keras.config.dtype_policy())

        # === Layers, and the functional graph (teacher forcing) ===
        # Each layer is made right before its first call, in graph order:
        # layers draw their initializer and dropout seeds when they are
        # made, so this order fixes the initial weights for a given seed.
        def embedding(vocab, layer_name):
            return PositionalEmbedding(vocab, d_model, max_sequence_length,
                                       position=position, dtype=policy,
                                       name=layer_name)

        def stack(prefix, block_class, x, call):
            """Dropout, ``num_layers`` blocks, the final norm (pre-norm
            only): made in this order, each right before its first call."""
            x = keras.layers.Dropout(dropout_rate, dtype=policy,
                                     name=f"{prefix}_dropout")(x)
            blocks = []
            for i in range(num_layers):
                blocks.append(block_class(**block_kwargs,
                                          name=f"{prefix}_layer_{i}"))
                x = call(blocks[-1], x)
            norm = None
            if norm_first:
                norm = keras.layers.LayerNormalization(
                    epsilon=layer_norm_epsilon, dtype=policy,
                    name=f"{prefix}_final_norm")
                x = norm(x)
            return blocks, norm, x

        if tie_embeddings == "all":
            source_embedding = target_embedding = embedding(
                vocabulary_size, "embedding")
        else:
            source_embedding = embedding(vocabulary_size, "source_embedding")
            target_embedding = embedding(target_vocabulary_size,
                                         "target_embedding")
        block_kwargs = dict(
            num_heads=num_heads, d_ff=d_ff, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            norm_first=norm_first, layer_norm_epsilon=layer_norm_epsilon,
            dtype=policy,
        )
        encoder_tokens = keras.Input((None,), dtype="int32",
                                     name="encoder_tokens")
        decoder_tokens = keras.Input((None,), dtype="int32",
                                     name="decoder_tokens")
        encoder_padding_mask = ops.not_equal(encoder_tokens, 0)
        decoder_padding_mask = ops.not_equal(decoder_tokens, 0)

        # The two stacks. (Layers are kept in locals and set as attributes
        # after ``super().__init__``: PyTorch's Module refuses sub-modules
        # assigned before it is initialised.)
        encoder_layers, encoder_final_norm, encoder_outputs = stack(
            "encoder", TransformerEncoderBlock, source_embedding(encoder_tokens),
            lambda block, x: block(x, padding_mask=encoder_padding_mask))
        decoder_layers, decoder_final_norm, y = stack(
            "decoder", TransformerDecoderBlock, target_embedding(decoder_tokens),
            lambda block, y: block(y, encoder_outputs,
                                   decoder_padding_mask=decoder_padding_mask,
                                   encoder_padding_mask=encoder_padding_mask))
        output_projection = None
        if tie_embeddings == "none":
            output_projection = keras.layers.Dense(
                target_vocabulary_size, name="output_projection",
                dtype="float32")
        logits = _logits(y, output_projection, target_embedding)
        super().__init__(
            {"encoder_tokens": encoder_tokens,
             "decoder_tokens": decoder_tokens},
            logits, name=name, **kwargs)
        self.source_embedding = source_embedding
        self.target_embedding = target_embedding
        self.encoder_layers = encoder_layers
        self.encoder_final_norm = encoder_final_norm
        self.decoder_layers = decoder_layers
        self.decoder_final_norm = decoder_final_norm
        self.output_projection = output_projection

        # === Config === (also attributes: model.d_model,
        # model.max_sequence_length...)
        self._config = dict(
            vocabulary_size=vocabulary_size, num_layers=num_layers,
            d_model=d_model, num_heads=num_heads, d_ff=d_ff,
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            max_sequence_length=max_sequence_length, position=position,
            tie_embeddings=tie_embeddings,
            target_vocabulary_size=target_vocabulary_size,
            norm_first=norm_first, layer_norm_epsilon=layer_norm_epsilon,
            dtype=policy.name,
        )
        for key, value in self._config.items():
            if key != "dtype":
                setattr(self, key, value)
        self.key_dim = d_model // num_heads

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable, **self._config}

    @classmethod
    def from_config(cls, config):
        # Configs saved before the rename name the positions ``max_length``.
        return cls(**v.renamed_key(config, "max_length", "max_sequence_length"))

    # -- the pieces (what the functional graph above is made of) ----------

    def _decoder_final(self, y):
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        return y

    def logits(self, hidden):
        """float ``(..., d_model)`` decoder output -> float32 logits
        ``(..., target vocabulary)`` (the tied ``h Eᵀ``, or the untied
        projection)."""
        return _logits(hidden, self.output_projection, self.target_embedding)

    def encode(self, encoder_tokens):
        """int ``(batch, T_src)`` ids (0 = padding) -> encoder outputs
        ``(batch, T_src, d_model)`` (inference: no dropout). Host (NumPy)
        ids outside the source vocabulary raise ``ValueError``."""
        v.host_ids_in_range("encoder_tokens", encoder_tokens,
                            self.source_embedding.vocabulary_size,
                            "the model's source vocabulary")
        x = self.source_embedding(encoder_tokens)
        mask = ops.not_equal(encoder_tokens, 0)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=mask)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x

    def decode(self, decoder_tokens, encoder_outputs, encoder_padding_mask):
        """The decoder over a whole prefix, without a cache: int ``(batch,
        T)`` ids -> float32 logits ``(batch, T, target vocabulary)``. Host
        (NumPy) ids outside the target vocabulary raise ``ValueError``."""
        v.host_ids_in_range("decoder_tokens", decoder_tokens,
                            self.target_embedding.vocabulary_size,
                            "the model's target vocabulary")
        y = self.target_embedding(decoder_tokens)
        decoder_mask = ops.not_equal(decoder_tokens, 0)
        for layer in self.decoder_layers:
            y = layer(y, encoder_outputs, decoder_padding_mask=decoder_mask,
                      encoder_padding_mask=encoder_padding_mask)
        return self.logits(self._decoder_final(y))

    # -- incremental decoding (``keras_trm.decoding.DecodingModel``) -------

    def cross_attention_caches(self, encoder_outputs):
        """What every decoding step reads of the source, computed once per
        search: ``(caches, shared)``, per decoder layer ``(keys, values)``
        float ``(batch, h, T_src, d_k)``, and the tied output kernel
        ``(d_model, vocab)`` transposed once here rather than at every step
        (None when the output layer is untied)."""
        caches = [layer.cross_attention_key_value_heads(encoder_outputs)
                  for layer in self.decoder_layers]
        if self.output_projection is not None:
            return caches, None
        table = self.target_embedding.embeddings
        return caches, ops.transpose(
            ops.cast(table, self.target_embedding.compute_dtype))

    def empty_caches(self, batch_size, num_positions, dtype):
        """Per decoder layer ``(keys, values)`` of zeros, float ``(batch,
        h, num_positions, d_k)``: fixed-size caches for ``decode_step``, or
        with 0 positions caches that grow (``grow=True``)."""
        shape = (batch_size, self.num_heads, num_positions, self.key_dim)
        return [(ops.zeros(shape, dtype), ops.zeros(shape, dtype))
                for _ in self.decoder_layers]

    def decode_step(self, tokens, index, caches, cross, encoder_padding_mask,
                    grow=False):
        """One decoder position over head-major self-attention caches.

        Args:
            tokens: int ``(batch, 1)``, the token at position ``index``.
            index: int scalar (may be a tensor), the position.
            caches: per layer ``(keys, values)`` float ``(batch, h, S,
                d_k)`` (``empty_caches``) holding positions ``0 .. index -
                1``. Fixed-size caches get position ``index`` written (the
                shapes never change: what XLA compiles); with ``grow`` S is
                ``index`` and the caches come back one position longer.
            cross: ``cross_attention_caches``' result; its caches have one
                row per row of ``tokens``, or one per sentence when
                ``tokens`` holds k consecutive rows per sentence (beam
                search: the same logits as k repeated rows, with k times
                less cache to read).
            encoder_padding_mask: bool ``(sentences, T_src)``, rows as
                ``cross``.
            grow: whether the caches grow (TensorFlow graphs, LiteRT).

        Returns:
            ``(logits (batch, vocab) float32, caches)``: the logits
            ``decode`` gives at position ``index``.
        """
        cross_caches, kernel = cross
        for name, given in (("caches", caches), ("cross_caches", cross_caches)):
            if len(given) != self.num_layers:
                raise ValueError(
                    f"`{name}` must hold one (keys, values) pair per decoder "
                    f"layer, num_layers={self.num_layers}, got {len(given)}")
        held = caches[0][0].shape[2]
        if (grow and isinstance(held, int)
                and isinstance(index, numbers.Integral) and held != index):
            raise ValueError(
                f"`caches` must hold the positions before `index`, got "
                f"index={index} and caches of {held} positions")
        y = self.target_embedding(tokens, start_index=index)
        # (batch, 1, 1, T_src): broadcast once for every layer's attention.
        cross_mask = ops.expand_dims(ops.expand_dims(
            ops.cast(encoder_padding_mask, "bool"), 1), 1)
        new_caches = []
        for layer, cache, keys_values in zip(self.decoder_layers, caches,
                                             cross_caches):
            y, cache = layer.call_with_cache(
                y, cache, keys_values, cross_mask,
                self_attention_cache_update_index=None if grow else index)
            new_caches.append(cache)
        y = self._decoder_final(y)
        if kernel is None:
            return self.logits(y)[:, 0, :], new_caches
        logits = ops.matmul(y, ops.cast(kernel, y.dtype))
        return ops.cast(logits, "float32")[:, 0, :], new_caches


def _logits(hidden, output_projection, target_embedding):
    if output_projection is not None:
        return ops.cast(output_projection(hidden), "float32")
    return target_embedding(hidden, reverse=True)


def transformer(vocabulary_size, **kwargs):
    """Builds an encoder-decoder ``Transformer`` (see its arguments).

    Returns:
        ``Transformer`` (a functional ``keras.Model``) with inputs
        ``{"encoder_tokens": int32 (batch, T_src), "decoder_tokens": int32
        (batch, T_tgt)}`` and output float32 logits ``(batch, T_tgt,
        target vocabulary)``.

    Raises:
        ValueError: as ``Transformer``.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> model = transformer(vocabulary_size=100, num_layers=1, d_model=16,
    ...                     num_heads=2, d_ff=32, max_sequence_length=20)
    >>> logits = model({"encoder_tokens": np.array([[5, 6, 3, 0]], "int32"),
    ...                 "decoder_tokens": np.array([[2, 7, 8]], "int32")})
    >>> tuple(logits.shape), keras.backend.standardize_dtype(logits.dtype)
    ((1, 3, 100), 'float32')
    """
    return Transformer(vocabulary_size, **kwargs)


def transformer_base(vocabulary_size=37000, **kwargs):
    """Transformer (base) of Table 3: N=6, d_model=512, d_ff=2048, h=8, 0.1.

    Example:

    >>> model = transformer_base(vocabulary_size=37000)
    >>> f"{model.count_params():,}"   # Table 3: 65M
    '63,082,496'
    """
    config = dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8,
                  dropout_rate=0.1, name="transformer_base")
    config.update(kwargs)
    return transformer(vocabulary_size, **config)


def transformer_big(vocabulary_size=37000, **kwargs):
    """Transformer (big) of Table 3: N=6, d_model=1024, d_ff=4096, h=16, 0.3.

    Example:

    >>> model = transformer_big(vocabulary_size=1000, num_layers=1)  # 1 layer: quick
    >>> block = model.get_layer("encoder_layer_0")
    >>> block.num_heads, block.d_ff, model.get_layer("embedding").d_model
    (16, 4096, 1024)
    """
    config = dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16,
                  dropout_rate=0.3, name="transformer_big")
    config.update(kwargs)
    return transformer(vocabulary_size, **config)


def transformer_small(vocabulary_size=10000, **kwargs):
    """The Multi30k quickstart's model: N=3, d_model=256, d_ff=1024, h=4,
    dropout 0.3, sequences of up to 128 tokens, for a 2-core CPU.

    The defaults are what ``keras-trm train-translation`` builds with no
    flags (its ``--model.*`` and ``--data.vocabulary_size`` defaults): the
    shape of the 29,000-pair recipe, with the dropout and the 10,000-id
    shared BPE vocabulary chosen on Multi30k's val split (issue #40,
    docs/recipes/multi30k.md). Until 2026-11-28 the preset had dropout 0.1,
    8,000 ids and 256 positions; pass them to build that model.

    Example:

    >>> model = transformer_small()
    >>> f"{model.count_params():,}"   # as the quickstart's log prints it
    '8,089,600'
    >>> model.get_layer("encoder_layer_0").dropout_rate
    0.3
    """
    config = dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4,
                  dropout_rate=0.3, max_sequence_length=128,
                  name="transformer_small")
    config.update(kwargs)
    return transformer(vocabulary_size, **config)


def as_transformer(model):
    """``model`` as a ``Transformer``, for models saved before it existed.

    ``.keras`` files written by earlier versions of ``transformer()`` load
    as plain functional models with the same layers; this rebuilds the
    ``Transformer`` their layers describe (by layer type) and copies the
    weights, so they decode like new ones. A ``Transformer`` is returned as
    is.

    Args:
        model: a ``keras.Model`` built by ``transformer()``.

    Returns:
        ``Transformer`` with ``model``'s weights.

    Raises:
        ValueError: ``model`` is not an encoder-decoder built by
            ``transformer()``.

    Example:

    >>> import numpy as np
    >>> new = transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=8,
    ...                   max_sequence_length=8)
    >>> old = keras.Model(new.inputs, new.outputs)   # a plain functional model
    >>> model = as_transformer(old)
    >>> type(model).__name__, all(np.array_equal(a, b) for a, b in
    ...                           zip(model.get_weights(), old.get_weights()))
    ('Transformer', True)
    """
    if isinstance(model, Transformer):
        return model

    def of_type(cls):
        return [layer for layer in getattr(model, "layers", [])
                if isinstance(layer, cls)]

    embeddings = of_type(PositionalEmbedding)
    encoder, decoder = (of_type(TransformerEncoderBlock),
                        of_type(TransformerDecoderBlock))
    dense = of_type(keras.layers.Dense)
    if not (embeddings and encoder and len(encoder) == len(decoder)
            and len(embeddings) <= 2 and len(dense) <= 1):
        raise ValueError(
            f"`model` ({getattr(model, 'name', model)!r}) was not built by "
            "keras_trm.models.transformer()")
    block, source = encoder[0], embeddings[0]
    if len(embeddings) == 1:
        tie, target_vocabulary_size = "all", None
    else:
        tie = "none" if dense else "decoder"
        target_vocabulary_size = embeddings[1].vocabulary_size
    rebuilt = Transformer(
        source.vocabulary_size, num_layers=len(encoder), d_model=source.d_model,
        num_heads=block.num_heads, d_ff=block.d_ff,
        dropout_rate=block.dropout_rate,
        attention_dropout_rate=block.attention_dropout_rate,
        max_sequence_length=source.max_sequence_length,
        position=source.position,
        tie_embeddings=tie, target_vocabulary_size=target_vocabulary_size,
        norm_first=block.norm_first, layer_norm_epsilon=block.layer_norm_epsilon,
        dtype=block.dtype_policy.name, name=model.name)
    # Layer by layer in graph order (the two models list their weights in
    # different orders when the embeddings are not shared).
    new_layers, old_layers = ([layer for layer in m.layers if layer.weights]
                              for m in (rebuilt, model))
    if len(new_layers) != len(old_layers):
        raise ValueError(
            f"`model` ({model.name!r}) has {len(old_layers)} layers with "
            f"weights, a transformer() of its configuration {len(new_layers)}")
    for new, old in zip(new_layers, old_layers):
        new.set_weights(old.get_weights())
    return rebuilt
