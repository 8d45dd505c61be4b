"""Keras layers of the Transformer family (one concept per module)."""

from keras_trm.layers.layer_normalization import LayerNormalization
from keras_trm.layers.multi_head_attention import MultiHeadAttention
from keras_trm.layers.positional_embedding import (
    PositionalEmbedding,
    sinusoidal_position_encoding,
)
from keras_trm.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock

__all__ = [
    "LayerNormalization",
    "MultiHeadAttention",
    "PositionalEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "sinusoidal_position_encoding",
]
