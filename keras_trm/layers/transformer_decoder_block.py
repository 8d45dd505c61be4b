"""Transformer decoder block (Vaswani et al. 2017, §3.1-3.2.3)."""

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.layers.transformer_encoder_block import _BlockBase, key_mask


@keras.saving.register_keras_serializable(package="keras_trm")
class TransformerDecoderBlock(_BlockBase):
    """One decoder layer: masked self-attention, encoder-decoder attention, FFN.

    §3.1: "the decoder inserts a third sub-layer, which performs multi-head
    attention over the output of the encoder stack"; self-attention is masked
    so position i sees only positions <= i (§3.2.3). Sub-layers are wired
    post-LN as in the paper or pre-LN with ``norm_first=True``.

    Args: as ``TransformerEncoderBlock``.

    Call arguments:
        inputs: float ``(batch, T_dec, d_model)``.
        encoder_outputs: float ``(batch, T_enc, d_model)``.
        decoder_padding_mask: optional bool ``(batch, T_dec)``.
        encoder_padding_mask: optional bool ``(batch, T_enc)``; defaults to
            the Keras mask carried by ``encoder_outputs``.
        training: bool.

    Returns:
        float ``(batch, T_dec, d_model)``. Incremental decoding goes through
        ``call_with_cache``.

    Raises:
        ValueError: d_model not divisible by ``num_heads``, bad rates.

    Example:

    >>> import numpy as np
    >>> block = TransformerDecoderBlock(num_heads=2, d_ff=32)
    >>> rng = np.random.default_rng(0)
    >>> y = rng.normal(size=(1, 4, 8)).astype("float32")
    >>> encoder_outputs = rng.normal(size=(1, 6, 8)).astype("float32")
    >>> out = block(y, encoder_outputs)
    >>> tuple(out.shape)
    (1, 4, 8)
    >>> y2 = y.copy()
    >>> y2[0, 3] = 0.0   # a later position does not reach earlier ones
    >>> bool(np.allclose(block(y2, encoder_outputs)[0, :3], out[0, :3], atol=1e-5))
    True

    Decoding position by position over a cache gives the same outputs:

    >>> cross = block.cross_attention_key_value_heads(encoder_outputs)
    >>> cache = block.self_attention.key_value_heads(y[:, :0])   # 0 positions
    >>> for t in range(4):
    ...     step, cache = block.call_with_cache(y[:, t:t + 1], cache, cross)
    ...     assert np.allclose(step[0, 0], out[0, t], atol=1e-5)
    """

    def build(self, inputs_shape, encoder_outputs_shape=None, **kwargs):
        if encoder_outputs_shape is None:
            encoder_outputs_shape = inputs_shape
        self.self_attention = self._attention("self_attention", inputs_shape,
                                              inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm",
                                              inputs_shape)
        self.cross_attention = self._attention(
            "cross_attention", inputs_shape, encoder_outputs_shape)
        self.cross_attention_norm = self._norm("cross_attention_norm",
                                               inputs_shape)
        self._build_ffn(inputs_shape)

    def cross_attention_key_value_heads(self, encoder_outputs):
        """Encoder keys/values for ``call_with_cache``, projected once.

        ``encoder_outputs`` float ``(batch, T_enc, d_model)`` -> ``(keys,
        values)``, each ``(batch, num_heads, T_enc, d_model // num_heads)``.
        """
        return self.cross_attention.key_value_heads(encoder_outputs)

    def call_with_cache(self, inputs, self_attention_cache,
                        cross_attention_cache, encoder_padding_mask=None,
                        self_attention_cache_update_index=None):
        """One incremental decoding step of this layer (inference).

        The arithmetic of ``call`` for the new position(s) ``inputs``, with
        head-major caches (``MultiHeadAttention.call_with_cache``).

        Args:
            inputs: float ``(batch, T, d_model)``, the embedded new
                position(s) (``T == 1`` when decoding token by token).
            self_attention_cache: ``(keys, values)``, each float ``(batch,
                num_heads, S, d_k)``; ``S`` may be 0.
            cross_attention_cache: ``(keys, values)``, each float
                ``(sentences, num_heads, T_enc, d_k)``: one row per row of
                ``inputs``, or per sentence of k consecutive rows (beam
                search's hypotheses).
            encoder_padding_mask: optional bool ``(sentences, T_enc)``, True
                at real source tokens, or already ``(sentences, 1, 1,
                T_enc)``.
            self_attention_cache_update_index: optional int (scalar
                tensor), the ``cache_update_index`` of the self-attention
                cache (fixed size S).

        Returns:
            ``(outputs (batch, T, d_model), self_attention_cache with S + T
            positions)`` (still S, written, with
            ``self_attention_cache_update_index``).

        Example: the class docstring's last lines (a cache decoding
        position by position gives ``call``'s outputs).
        """
        cross_mask = encoder_padding_mask
        if cross_mask is not None and len(cross_mask.shape) == 2:
            cross_mask = ops.expand_dims(key_mask(cross_mask), 1)
        new_cache = None

        def self_attend(y):
            nonlocal new_cache
            out, new_cache = self.self_attention.call_with_cache(
                y, self_attention_cache, new_key_value=y,
                cache_update_index=self_attention_cache_update_index)
            return out

        def cross_attend(y):
            # The rows of ``y`` may be k hypotheses per sentence (beam
            # search): a sentence's k * T queries attend to its one cache
            # row together (as k repeated rows, with k times less read).
            shape = ops.shape(y)
            sentences = ops.shape(cross_attention_cache[0])[0]
            grouped = ops.reshape(y, (sentences, -1, y.shape[-1]))
            out, _ = self.cross_attention.call_with_cache(
                grouped, cross_attention_cache, attention_mask=cross_mask)
            return ops.reshape(out, shape)

        # A NumPy array (``__call__`` would convert it) plus a PyTorch tensor
        # is a TypeError.
        inputs = ops.convert_to_tensor(inputs, self.compute_dtype)
        x = self._residual(inputs, self.self_attention_norm, self_attend, False)
        x = self._residual(x, self.cross_attention_norm, cross_attend, False)
        return self._ffn(x, False), new_cache

    def call(self, inputs, encoder_outputs, decoder_padding_mask=None,
             encoder_padding_mask=None, training=None):
        if decoder_padding_mask is None:
            decoder_padding_mask = getattr(inputs, "_keras_mask", None)
        if encoder_padding_mask is None:
            encoder_padding_mask = getattr(encoder_outputs, "_keras_mask", None)
        v.mask_shape("decoder_padding_mask", decoder_padding_mask,
                     inputs.shape[:-1], "(batch, T_dec), as `inputs`")
        v.mask_shape("encoder_padding_mask", encoder_padding_mask,
                     encoder_outputs.shape[:-1], "(batch, T_enc), as `encoder_outputs`")

        # Masked self-attention (§3.2.3): padded keys and the future are
        # hidden; then queries from the decoder over the encoder output.
        self_mask = key_mask(decoder_padding_mask)
        cross_mask = key_mask(encoder_padding_mask)
        x = self._residual(
            inputs, self.self_attention_norm,
            lambda y: self.self_attention(
                y, y, attention_mask=self_mask, use_causal_mask=True,
                training=training),
            training)
        x = self._residual(
            x, self.cross_attention_norm,
            lambda y: self.cross_attention(
                y, encoder_outputs, attention_mask=cross_mask,
                training=training),
            training)
        return self._ffn(x, training)

    def compute_mask(self, inputs, *args, **kwargs):
        return getattr(inputs, "_keras_mask", None)
