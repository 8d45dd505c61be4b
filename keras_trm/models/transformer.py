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

import keras
from keras import ops

from keras_trm.layers import _validation as v
from keras_trm.layers.positional_embedding import PositionalEmbedding
from keras_trm.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock

TIE_MODES = {"all", "decoder", "none"}


def transformer(
    vocabulary_size,
    num_layers=6,
    d_model=512,
    num_heads=8,
    d_ff=2048,
    dropout_rate=0.1,
    attention_dropout_rate=0.0,
    max_length=256,
    position="sinusoidal",
    tie_embeddings="all",
    target_vocabulary_size=None,
    norm_first=False,
    layer_norm_epsilon=1e-6,
    name="transformer",
):
    """Builds an encoder-decoder Transformer returning next-token logits.

    Architecture (Vaswani et al. 2017, §3, Figure 1): token embedding x
    sqrt(d_model) + position encoding, dropout (§5.4); ``num_layers``
    encoder blocks over the source; ``num_layers`` decoder blocks over the
    shifted target with causal self-attention and attention over the
    encoder output; a linear projection to the vocabulary (softmax is left
    to the loss). With ``tie_embeddings="all"`` source embedding, target
    embedding and output projection are one matrix (§3.4, shared
    vocabulary); ``"decoder"`` ties only the target side (needs
    ``target_vocabulary_size``); ``"none"`` ties nothing.

    Args:
        vocabulary_size: int, the (source, or shared) vocabulary size; id 0 is
            padding.
        num_layers: N, encoder and decoder layers each.
        d_model, num_heads, d_ff: model width, heads (must divide d_model),
            FFN inner width.
        dropout_rate: residual and embedding dropout P_drop.
        attention_dropout_rate: dropout on attention probabilities.
        max_length: longest source or target sequence (tokens).
        position: ``"sinusoidal"`` (paper) or ``"learned"``.
        tie_embeddings: ``"all"``, ``"decoder"`` or ``"none"``.
        target_vocabulary_size: int; target vocabulary when not shared.
        norm_first: pre-LN blocks (plus a final LayerNorm per stack).

    Returns:
        ``keras.Model`` with inputs ``{"encoder_tokens": int32 (batch,
        T_src), "decoder_tokens": int32 (batch, T_tgt)}`` and output float32
        logits ``(batch, T_tgt, target vocabulary)``.

    Raises:
        ValueError: ``d_model`` not divisible by ``num_heads``; a bad
            ``tie_embeddings``; a shared tie with two vocabulary sizes.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> model = transformer(vocabulary_size=100, num_layers=1, d_model=16,
    ...                     num_heads=2, d_ff=32, max_length=20)
    >>> logits = model({"encoder_tokens": np.array([[5, 6, 3, 0]], "int32"),
    ...                 "decoder_tokens": np.array([[2, 7, 8]], "int32")})
    >>> tuple(logits.shape), keras.backend.standardize_dtype(logits.dtype)
    ((1, 3, 100), 'float32')
    """
    v.positive_int("vocabulary_size", vocabulary_size)
    v.positive_int("num_layers", num_layers)
    v.positive_int("d_model", d_model)
    v.positive_int("num_heads", num_heads)
    v.divisible("d_model", d_model, "num_heads", num_heads)
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

    def embedding(vocab, layer_name):
        return PositionalEmbedding(
            vocab, d_model, max_length, position=position, name=layer_name
        )

    if tie_embeddings == "all":
        source_embedding = target_embedding = embedding(
            vocabulary_size, "embedding"
        )
    else:
        source_embedding = embedding(vocabulary_size, "source_embedding")
        target_embedding = embedding(target_vocabulary_size, "target_embedding")

    block_kwargs = dict(
        num_heads=num_heads,
        d_ff=d_ff,
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        norm_first=norm_first,
        layer_norm_epsilon=layer_norm_epsilon,
    )

    encoder_tokens = keras.Input((None,), dtype="int32", name="encoder_tokens")
    decoder_tokens = keras.Input((None,), dtype="int32", name="decoder_tokens")
    encoder_padding_mask = ops.not_equal(encoder_tokens, 0)
    decoder_padding_mask = ops.not_equal(decoder_tokens, 0)

    # Encoder stack.
    x = source_embedding(encoder_tokens)
    x = keras.layers.Dropout(dropout_rate, name="encoder_dropout")(x)
    for i in range(num_layers):
        x = TransformerEncoderBlock(**block_kwargs, name=f"encoder_layer_{i}")(
            x, padding_mask=encoder_padding_mask
        )
    if norm_first:
        x = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, name="encoder_final_norm"
        )(x)
    encoder_outputs = x

    # Decoder stack.
    y = target_embedding(decoder_tokens)
    y = keras.layers.Dropout(dropout_rate, name="decoder_dropout")(y)
    for i in range(num_layers):
        y = TransformerDecoderBlock(**block_kwargs, name=f"decoder_layer_{i}")(
            y,
            encoder_outputs,
            decoder_padding_mask=decoder_padding_mask,
            encoder_padding_mask=encoder_padding_mask,
        )
    if norm_first:
        y = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, name="decoder_final_norm"
        )(y)

    if tie_embeddings == "none":
        logits = keras.layers.Dense(
            target_vocabulary_size, name="output_projection", dtype="float32"
        )(y)
    else:
        logits = target_embedding(y, reverse=True)
    return keras.Model(
        {"encoder_tokens": encoder_tokens, "decoder_tokens": decoder_tokens},
        logits,
        name=name,
    )


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


def transformer_small(vocabulary_size=8000, **kwargs):
    """A CPU-sized preset (N=3, d_model=256, d_ff=1024, h=4, dropout 0.1).

    Used by the Multi30k recipe, which trains on a 2-core CPU.

    Example:

    >>> model = transformer_small(vocabulary_size=8000)
    >>> f"{model.count_params():,}"
    '7,577,600'
    """
    config = dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4,
                  dropout_rate=0.1, name="transformer_small")
    config.update(kwargs)
    return transformer(vocabulary_size, **config)


class TransformerParts:
    """The pieces of a model built by ``transformer()``, for decoding.

    Decoding calls the encoder once and the decoder one token at a time with
    a key/value cache; this class finds the layers by the names the builder
    gives them, so any saved/loaded ``transformer()`` model can be decoded.

    ``decode_step`` works on fixed-size ``(batch, 2, S, h, d_k)`` caches
    (static shapes, for XLA); ``fast_decode_step`` gives the same logits on
    head-major caches that grow one position per step (what the searches
    use by default, faster in graph mode).

    Raises:
        ValueError: the model was not built by ``transformer()``.

    Example:

    >>> import numpy as np
    >>> model = transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=8,
    ...                     max_length=8)
    >>> parts = TransformerParts(model)
    >>> src = np.array([[5, 6, 3]], "int32")
    >>> enc = parts.encode(src)
    >>> cross = parts.fast_cross_attention_caches(enc)
    >>> caches = parts.fast_empty_self_attention_caches(1, enc.dtype)
    >>> logits, caches = parts.fast_decode_step(
    ...     np.array([[2]], "int32"), 0, caches, cross, src != 0)
    >>> tuple(logits.shape), tuple(caches[0][0].shape)
    ((1, 20), (1, 2, 1, 4))
    """

    def __init__(self, model):
        self.model = model
        names = {layer.name for layer in model.layers}
        if "embedding" in names:
            self.source_embedding = self.target_embedding = model.get_layer(
                "embedding"
            )
        elif "source_embedding" in names:
            self.source_embedding = model.get_layer("source_embedding")
            self.target_embedding = model.get_layer("target_embedding")
        else:
            raise ValueError(
                f"`model` ({model.name!r}) was not built by "
                "keras_trm.models.transformer(): it has no embedding layer"
            )
        self.encoder_layers = self._numbered("encoder_layer_")
        self.decoder_layers = self._numbered("decoder_layer_")
        self.encoder_final_norm = self._maybe("encoder_final_norm")
        self.decoder_final_norm = self._maybe("decoder_final_norm")
        self.output_projection = self._maybe("output_projection")
        self.max_length = self.target_embedding.max_length
        attention = self.decoder_layers[0].self_attention
        self.num_heads = attention.num_heads
        self.key_dim = attention.key_dim
        self.vocabulary_size = (
            self.output_projection.units
            if self.output_projection is not None
            else self.target_embedding.vocabulary_size
        )

    def _maybe(self, name):
        try:
            return self.model.get_layer(name)
        except ValueError:
            return None

    def _numbered(self, prefix):
        layers = []
        while (layer := self._maybe(f"{prefix}{len(layers)}")) is not None:
            layers.append(layer)
        return layers

    def encode(self, encoder_tokens):
        """``(batch, T_src)`` ids -> ``(batch, T_src, d_model)`` outputs."""
        mask = ops.not_equal(encoder_tokens, 0)
        x = self.source_embedding(encoder_tokens)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=mask)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x

    def cross_attention_caches(self, encoder_outputs):
        return [
            layer.precompute_cross_attention_cache(encoder_outputs)
            for layer in self.decoder_layers
        ]

    def empty_self_attention_caches(self, batch_size, max_length, dtype):
        shape = (batch_size, 2, max_length, self.num_heads, self.key_dim)
        return [ops.zeros(shape, dtype) for _ in self.decoder_layers]

    def decode_step(self, tokens, index, self_caches, cross_caches,
                    encoder_padding_mask):
        """One incremental decoder step.

        Args:
            tokens: int ``(batch, 1)``, the token at position ``index``.
            index: int scalar tensor, the position.
            self_caches: list per layer of ``(batch, 2, S, h, d_k)``.
            cross_caches: list per layer of ``(batch, 2, T_src, h, d_k)``.
            encoder_padding_mask: bool ``(batch, T_src)``.

        Returns:
            ``(logits (batch, vocab) float32, new self_caches)``.
        """
        y = self.target_embedding(tokens, start_index=index)
        new_caches = []
        for layer, cache, cross in zip(
            self.decoder_layers, self_caches, cross_caches
        ):
            y, cache = layer(
                y,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross,
            )
            new_caches.append(cache)
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        return self.logits(y)[:, 0, :], new_caches

    # -- fast incremental decoding (what the searches use) -----------------
    # Head-major caches that grow one position per step: each decoder
    # layer's ``call_with_cache`` (``MultiHeadAttention.call_with_cache``
    # inside). The arithmetic is that of ``decode_step``.

    def fast_cross_attention_caches(self, encoder_outputs):
        """Per decoder layer ``(keys, values)``, each float ``(batch, h,
        T_src, d_k)``: the encoder output projected once per sentence."""
        return [layer.cross_attention_key_value_heads(encoder_outputs)
                for layer in self.decoder_layers]

    def fast_empty_self_attention_caches(self, batch_size, dtype):
        """Per decoder layer ``(keys, values)`` of 0 positions: float
        ``(batch, h, 0, d_k)``."""
        empty = ops.zeros((batch_size, self.num_heads, 0, self.key_dim), dtype)
        return [(empty, empty) for _ in self.decoder_layers]

    def fast_output_kernel(self):
        """``(d_model, vocab)``: the tied output projection (the transposed
        embedding table), to transpose once per search instead of once per
        step; None when the output layer is untied."""
        if self.output_projection is not None:
            return None
        table = self.target_embedding.embeddings
        return ops.transpose(ops.cast(table, self.target_embedding.compute_dtype))

    def fast_decode_step(self, tokens, index, self_caches, cross_caches,
                         encoder_padding_mask, output_kernel=None):
        """``decode_step`` on head-major caches (same logits).

        Args:
            tokens: int ``(batch, 1)``, the token at position ``index``.
            index: int scalar (tensor), the position; ``self_caches`` hold
                positions ``0 .. index - 1``.
            self_caches: per layer ``(keys, values)`` float ``(batch, h,
                index, d_k)``.
            cross_caches: from ``fast_cross_attention_caches``.
            encoder_padding_mask: bool ``(batch, T_src)``.
            output_kernel: optional ``fast_output_kernel()`` (tied models).

        Returns:
            ``(logits (batch, vocab) float32, self_caches with index + 1
            positions)``.
        """
        y = self.target_embedding(tokens, start_index=index)
        # (batch, 1, 1, T_src): broadcast once for every layer's attention.
        cross_mask = ops.expand_dims(ops.expand_dims(
            ops.cast(encoder_padding_mask, "bool"), 1), 1)
        new_caches = []
        for layer, cache, cross in zip(self.decoder_layers, self_caches,
                                       cross_caches):
            y, cache = layer.call_with_cache(y, cache, cross, cross_mask)
            new_caches.append(cache)
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        if output_kernel is not None:
            logits = ops.cast(ops.matmul(y, ops.cast(output_kernel, y.dtype)),
                              "float32")
            return logits[:, 0, :], new_caches
        return self.logits(y)[:, 0, :], new_caches

    def decode_full(self, decoder_tokens, encoder_outputs, encoder_padding_mask):
        """Full (uncached) decoder pass: ``(batch, T)`` ids -> logits
        ``(batch, T, vocab)``."""
        y = self.target_embedding(decoder_tokens)
        decoder_mask = ops.not_equal(decoder_tokens, 0)
        for layer in self.decoder_layers:
            y = layer(
                y,
                encoder_outputs,
                decoder_padding_mask=decoder_mask,
                encoder_padding_mask=encoder_padding_mask,
            )
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        return self.logits(y)

    def logits(self, hidden):
        if self.output_projection is not None:
            return ops.cast(self.output_projection(hidden), "float32")
        return self.target_embedding(hidden, reverse=True)
