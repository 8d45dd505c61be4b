"""Transformer-XL language model (Dai et al. 2019) and a vanilla baseline.

``TransformerXLLM`` is the decoder-only model of Dai et al. (2019) §3:

    h^0_τ      = Dropout(E[x_τ] · sqrt(d_model))           (no absolute positions)
    m^{n-1}_τ  = SG([m^{n-1}_{τ-1} ∘ h^{n-1}_{τ-1}])[-mem_len:]
    h^n_τ      = TransformerXLBlock_n(h^{n-1}_τ, memory=m^{n-1}_τ)
    logits_τ   = Dropout(h^N_τ) · Eᵀ + b                    (tied output)

so the memory of layer n is the history of that layer's *input*, kept for
``mem_len`` positions without gradient. Positions enter only through the
relative attention of every block (§3.3).

``vanilla_transformer_lm`` is the baseline (Al-Rfou et al. 2018 style,
without auxiliary losses): absolute sinusoidal positions, causal
self-attention within a fixed-length segment and no memory.
``keras_trm.decoding.evaluate_sliding_window`` recomputes its whole context
for every new token, the cost Transformer-XL's memory removes (Dai et al.
§3.2; ``keras_trm.decoding.evaluate_with_memory``).

Both models take int32 ``(batch, T)`` token ids (id 0 is an ordinary token:
there is no padding in ordered LM batches) and return float32 logits.
"""

import math

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.models.functional import IntegerInputsModel, check_stack
from keras_trm.layers._initializers import clone_initializer
from keras_trm.layers.positional_embedding import PositionalEmbedding
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_trm.layers.transformer_xl_block import TransformerXLBlock


def _check_token_ids(token_ids, max_segment_len, model_name):
    shape = tuple(token_ids.shape)
    if len(shape) != 2:
        raise ValueError(
            f"`token_ids` must have shape (batch, T), got token_ids.shape={shape}")
    v.integer_ids("token_ids", token_ids)
    if shape[1] is not None and shape[1] > max_segment_len:
        raise ValueError(
            f"`token_ids` has segment length T={shape[1]} (token_ids.shape="
            f"{shape}), longer than max_segment_len={max_segment_len} of "
            f"model '{model_name}'")


# The model's arguments that every TransformerXLBlock receives unchanged
# (besides mem_len, which the blocks store: see TransformerXLLM.mem_len).
_BLOCK_ARGUMENTS = (
    "num_heads", "d_ff", "key_dim", "dropout_rate", "attention_dropout_rate",
    "same_length", "clamp_len", "untie_biases", "norm_first", "layer_norm_epsilon")


@keras.saving.register_keras_serializable(package="keras_trm")
class TransformerXLLM(keras.Model):
    """Transformer-XL language model with segment-level recurrence.

    Token embedding E scaled by sqrt(d_model), dropout, ``num_layers``
    ``TransformerXLBlock``s (pre-LN plus a final LayerNorm with
    ``norm_first``), dropout, and logits ``h Eᵀ + b`` tied to the embedding
    table (``b`` a learned bias, as the reference code's tied softmax).
    Each layer owns its u, v (``untie_biases=True``, the reference code's
    ``untie_r``), or one pair owned by the model is shared by all layers.

    The memory of layer n for the next segment is
    ``SG(concat([memory_n, input_n]))[:, -mem_len:]``, ``input_n`` the input
    of layer n on this segment: with ``mem_len`` covering the whole past,
    segment-by-segment evaluation gives the logits of one pass over the
    whole sequence. The model is built when constructed and round-trips
    through ``.keras`` files.

    Args:
        vocabulary_size, num_layers (N), num_heads: ints > 0.
        d_model: even int > 0.
        d_ff: int > 0, FFN inner width.
        mem_len: int >= 0, positions of memory kept per layer (0 = none),
            and the window of ``same_length`` (see ``set_mem_len``).
        max_segment_len: int > 0, the longest segment T accepted by ``call``
            (the memory may be of any length).
        key_dim: optional d_head (default d_model // num_heads).
        dropout_rate: float in [0, 1), on the embedding output, each
            sub-layer output and the final hidden states.
        attention_dropout_rate: float in [0, 1), on attention probabilities.
        same_length, clamp_len: as ``TransformerXLBlock``.
        untie_biases: bool, per-layer u/v (True) or one shared pair (False).
        norm_first: bool, pre-LN blocks plus a final LayerNorm.
        layer_norm_epsilon: float.
        use_output_bias: bool, learned bias on the tied logits.
        embeddings_initializer: default ``normal(0, d_model**-0.5)`` so that
            scaled embeddings start at unit scale.

    Call arguments:
        token_ids: int ``(batch, T)`` with ``T <= max_segment_len``.
        memories: None (no memory) or a list of ``num_layers`` float
            tensors ``(batch, M, d_model)`` with one M (e.g. the previous
            segment's ``new_memories``, or ``init_memories(batch)``).
        training: bool, enables dropout.

    Returns:
        ``(logits, new_memories)``: float32 ``(batch, T, vocabulary_size)``
        and a list of ``num_layers`` tensors ``(batch, min(mem_len, M + T),
        d_model)`` without gradient.

    Raises:
        ValueError: bad constructor arguments; a segment longer than
            ``max_segment_len``; ``token_ids`` not of rank 2; ``memories``
            not a list of ``num_layers`` tensors, or of the wrong rank,
            batch size, d_model, or unequal lengths.
        TypeError: non-integer ``token_ids``, non-integer sizes.

    Example (two segments, the memory of the first carried into the
    second):

    >>> import numpy as np
    >>> lm = TransformerXLLM(11, num_layers=2, d_model=8, num_heads=2,
    ...                      d_ff=16, mem_len=4, max_segment_len=4)
    >>> logits, memories = lm(np.ones((2, 3), "int32"))
    >>> tuple(logits.shape), [tuple(m.shape) for m in memories]
    ((2, 3, 11), [(2, 3, 8), (2, 3, 8)])
    >>> logits, memories = lm(np.ones((2, 3), "int32"), memories)
    >>> [tuple(m.shape) for m in memories]   # min(mem_len, 3 + 3) positions
    [(2, 4, 8), (2, 4, 8)]
    """

    def __init__(
        self, vocabulary_size, num_layers=4, d_model=256, num_heads=4,
        d_ff=1024, mem_len=64, max_segment_len=512, key_dim=None,
        dropout_rate=0.1, attention_dropout_rate=0.0, untie_biases=True,
        norm_first=False, layer_norm_epsilon=1e-5, use_output_bias=True,
        embeddings_initializer=None, same_length=False, clamp_len=None,
        **kwargs,
    ):
        kwargs.setdefault("name", "transformer_xl_lm")
        super().__init__(**kwargs)
        self.vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
        self.num_layers = v.positive_int("num_layers", num_layers)
        self.d_model = v.positive_int("d_model", d_model)
        if self.d_model % 2:
            raise ValueError(
                "`d_model` must be even (sinusoidal relative positions), got "
                f"d_model={d_model}")
        self.num_heads = v.positive_int("num_heads", num_heads)
        self.d_ff = v.positive_int("d_ff", d_ff)
        mem_len = v.non_negative_int("mem_len", mem_len)
        self.max_segment_len = v.positive_int("max_segment_len",
                                              max_segment_len)
        self.key_dim = None if key_dim is None else v.positive_int(
            "key_dim", key_dim)
        if self.key_dim is None:
            v.divisible("d_model", self.d_model, "num_heads", self.num_heads)
        self.dropout_rate = v.rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = v.rate("attention_dropout_rate",
                                             attention_dropout_rate)
        self.same_length = bool(same_length)
        if clamp_len is not None:
            clamp_len = v.non_negative_int("clamp_len", clamp_len)
        self.clamp_len = clamp_len
        self.untie_biases = bool(untie_biases)
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = v.positive_float("layer_norm_epsilon",
                                                   layer_norm_epsilon)
        self.use_output_bias = bool(use_output_bias)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(
                stddev=self.d_model**-0.5)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer)
        # The sub-layers; their weights and the model's are made by build().
        # mem_len is stored by the blocks only (the ``mem_len`` property).
        self.embedding = keras.layers.Embedding(
            self.vocabulary_size, self.d_model,
            embeddings_initializer=clone_initializer(
                self.embeddings_initializer),
            dtype=self.dtype_policy, name="embedding")
        self.dropout_layer = keras.layers.Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="dropout")
        self.blocks = [
            TransformerXLBlock(
                **{name: getattr(self, name) for name in _BLOCK_ARGUMENTS},
                mem_len=mem_len, dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(self.num_layers)]
        self.final_norm = None
        if self.norm_first:
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
                name="final_norm")
        self.build()

    # -- construction --------------------------------------------------------
    def build(self, *unused_args, **unused_kwargs):
        if self.built:
            return
        d = self.d_model
        self.embedding.build((None, None))
        for block in self.blocks:
            block.build((None, None, d))
        if self.final_norm is not None:
            self.final_norm.build((None, None, d))
        self.content_bias = self.position_bias = self.output_bias = None
        if not self.untie_biases:
            head = (self.num_heads, self.key_dim or d // self.num_heads)
            self.content_bias = self.add_weight(
                name="content_bias", shape=head, initializer="zeros")
            self.position_bias = self.add_weight(
                name="position_bias", shape=head, initializer="zeros")
        if self.use_output_bias:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(self.vocabulary_size,),
                initializer="zeros")
        self.built = True

    def get_build_config(self):
        return {"built": True}

    def build_from_config(self, config):
        self.build()

    # -- memories -------------------------------------------------------------
    def init_memories(self, batch_size):
        """Empty memories: ``num_layers`` zero tensors ``(batch, 0, d_model)``."""
        batch_size = v.positive_int("batch_size", batch_size)
        return [ops.zeros((batch_size, 0, self.d_model), self.compute_dtype)
                for _ in range(self.num_layers)]

    @property
    def mem_len(self):
        """int >= 0, the blocks' ``mem_len`` (change it with ``set_mem_len``)."""
        return self.blocks[0].mem_len

    def set_mem_len(self, mem_len):
        """Changes ``mem_len`` in every block: how many positions new
        memories keep and, with ``same_length``, each query's window (e.g.
        longer at evaluation, as ``reset_length`` of the reference code).

        ``mem_len`` is a Python int fixed in a trace: the functions compiled
        by ``predict``/``evaluate``/``fit`` are dropped and traced again
        (``keras_trm.decoding.evaluate_with_memory`` keys its traces by
        ``mem_len``); a ``tf.function`` of your own keeps the old length.

        Args:
            mem_len: int >= 0 (> 0 with ``same_length``).

        Raises:
            ValueError: ``mem_len`` < 0, or 0 with ``same_length``.
            TypeError: ``mem_len`` not an int.
        """
        mem_len = v.non_negative_int("mem_len", mem_len)
        for block in self.blocks:
            block.mem_len = mem_len
        self.predict_function = self.test_function = self.train_function = None

    def _check_memories(self, memories, token_ids):
        is_list = isinstance(memories, (list, tuple))
        if not is_list or len(memories) != self.num_layers:
            got = (f"a list of {len(memories)}" if is_list
                   else type(memories).__name__)
            raise ValueError(
                f"`memories` must be a list of num_layers={self.num_layers} "
                f"tensors (batch, M, d_model={self.d_model}), got {got}")
        batch = token_ids.shape[0]
        shapes = [tuple(m.shape) for m in memories]
        for i, shape in enumerate(shapes):
            if (len(shape) != 3 or shape[-1] != self.d_model
                    or None not in (batch, shape[0]) and shape[0] != batch):
                raise ValueError(
                    f"`memories[{i}]` must have shape (batch={batch}, M, "
                    f"d_model={self.d_model}) to match token_ids.shape="
                    f"{tuple(token_ids.shape)}, got memories[{i}].shape="
                    f"{shape}")
        if len({s[1] for s in shapes if s[1] is not None}) > 1:
            raise ValueError(
                f"`memories` must all have the same length M, got shapes {shapes}")

    # -- forward ----------------------------------------------------------------
    def embed(self, token_ids, training=None):
        """``Dropout(E[token_ids] * sqrt(d_model))``, the input of layer 0."""
        x = ops.cast(self.embedding(token_ids), self.compute_dtype)
        x = x * ops.cast(math.sqrt(self.d_model), x.dtype)
        return self.dropout_layer(x, training=training)

    def logits(self, hidden):
        """Tied output: ``hidden · Eᵀ (+ b)`` in float32."""
        table = ops.cast(self.embedding.embeddings, hidden.dtype)
        out = ops.cast(ops.matmul(hidden, ops.transpose(table)), "float32")
        if self.output_bias is not None:
            out = out + ops.cast(self.output_bias, "float32")
        return out

    def call(self, token_ids, memories=None, training=None):
        token_ids = ops.convert_to_tensor(token_ids)
        _check_token_ids(token_ids, self.max_segment_len, self.name)
        if memories is not None:
            memories = [ops.convert_to_tensor(m) for m in memories]
            self._check_memories(memories, token_ids)
        # A dynamic length in a TensorFlow graph is checked when it runs.
        with v.at_most_when_run(ops.shape(token_ids)[1], self.max_segment_len, (
                "`token_ids` segment length exceeds max_segment_len="
                f"{self.max_segment_len} of model '{self.name}'")):
            x = self.embed(token_ids, training=training)
        new_memories = []
        for i, block in enumerate(self.blocks):
            memory = None if memories is None else memories[i]
            new_memories.append(block.compute_new_memory(x, memory))
            x = block(x, memory=memory, content_bias=self.content_bias,
                      position_bias=self.position_bias, training=training)
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = self.dropout_layer(x, training=training)
        return self.logits(x), new_memories

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in (
            "vocabulary_size", "num_layers", "d_model", "mem_len",
            "max_segment_len", "use_output_bias", *_BLOCK_ARGUMENTS)})
        config["embeddings_initializer"] = keras.initializers.serialize(
            self.embeddings_initializer)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


# -- vanilla baseline ----------------------------------------------------------
def vanilla_transformer_lm(
    vocabulary_size, num_layers=4, d_model=256, num_heads=4, d_ff=1024,
    max_sequence_length=512, dropout_rate=0.1, attention_dropout_rate=0.0,
    position="sinusoidal", norm_first=False, layer_norm_epsilon=1e-5,
    name="vanilla_transformer_lm", max_length=None,
):
    """The fixed-context baseline: absolute positions, causal attention.

    Token embedding x sqrt(d_model) + sinusoidal positions 0..T-1
    (``PositionalEmbedding``, no padding mask: id 0 is a real token),
    dropout, ``num_layers`` ``TransformerEncoderBlock``s called with
    ``use_causal_mask=True``, [final LayerNorm with ``norm_first``],
    dropout, logits tied to the embedding table. Sizes mean the same as in
    ``TransformerXLLM``; the two differ only in positions (absolute vs
    relative), memory, the output bias and the per-layer W_{k,R}, u, v.

    Args:
        vocabulary_size: as ``TransformerXLLM``, and so are ``num_layers``,
            ``d_model``, ``num_heads``, ``d_ff``, ``dropout_rate``,
            ``attention_dropout_rate``, ``norm_first`` and
            ``layer_norm_epsilon``.
        max_sequence_length: int, the positions of the embedding's table:
            the longest segment (and evaluation context). ``max_length``:
            its old name, deprecated.
        position: ``"sinusoidal"`` (default) or ``"learned"``.

    Returns:
        an ``IntegerInputsModel`` (a functional ``keras.Model`` that refuses
        float ids): int32 ``token_ids (batch, T)`` -> float32 logits
        ``(batch, T, vocabulary_size)``.

    Raises:
        ValueError: d_model not divisible by num_heads, odd d_model with
            sinusoids, bad sizes or rates.

    Example:

    >>> import numpy as np
    >>> lm = vanilla_transformer_lm(11, num_layers=1, d_model=8, num_heads=2,
    ...                             d_ff=16, max_sequence_length=6)
    >>> tuple(lm(np.ones((2, 6), "int32")).shape)
    (2, 6, 11)
    """
    max_sequence_length = v.renamed("max_length", max_length,
                                    "max_sequence_length", max_sequence_length)
    check_stack(vocabulary_size, num_layers, d_model, num_heads, dropout_rate,
                attention_dropout_rate, layer_norm_epsilon)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = PositionalEmbedding(
        vocabulary_size, d_model, max_sequence_length, position=position,
        mask_zero=False, name="embedding")
    x = embedding(token_ids)
    x = keras.layers.Dropout(dropout_rate, name="embedding_dropout")(x)
    for i in range(num_layers):
        x = TransformerEncoderBlock(
            num_heads=num_heads, d_ff=d_ff, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            norm_first=norm_first, layer_norm_epsilon=layer_norm_epsilon,
            name=f"layer_{i}")(x, use_causal_mask=True)
    if norm_first:
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon,
                                            name="final_norm")(x)
    x = keras.layers.Dropout(dropout_rate, name="output_dropout")(x)
    logits = embedding(x, reverse=True)
    return IntegerInputsModel(token_ids, logits, name=name)
