"""Keras layers of the Transformer family (one concept per module)."""

from keras_trm.layers.layer_normalization import LayerNormalization
from keras_trm.layers.lstm_ln import LSTM_LN, LSTMLNCell
from keras_trm.layers.multi_head_attention import MultiHeadAttention
from keras_trm.layers.positional_embedding import (
    PositionalEmbedding, sinusoidal_position_encoding)
from keras_trm.layers.relative_attention import (
    RelativeMultiHeadAttention, rel_shift, relative_position_encoding)
from keras_trm.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_trm.layers.transformer_xl_block import TransformerXLBlock

__all__ = [
    "LSTMLNCell", "LSTM_LN", "LayerNormalization", "MultiHeadAttention",
    "PositionalEmbedding", "RelativeMultiHeadAttention",
    "TransformerDecoderBlock", "TransformerEncoderBlock", "TransformerXLBlock",
    "rel_shift", "relative_position_encoding", "sinusoidal_position_encoding",
]
