"""Layer-normalized LSTM (Ba, Kiros and Hinton 2016, "Layer Normalization",
arXiv:1607.06450, §3.1 and Appendix): ``LSTMLNCell`` is one step,
``LSTM_LN`` the ``keras.layers.RNN`` over a sequence.
"""

import keras
from keras import ops

# Keras 3's per-sequence dropout masks, reset by keras.layers.RNN.
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import clone_initializer

_INITIALIZERS = ("kernel_initializer", "recurrent_initializer", "bias_initializer")
_REGULARIZERS = ("kernel_regularizer", "recurrent_regularizer", "bias_regularizer")


def _layer_norm(z, gamma, beta, epsilon):
    """LN over the last axis, statistics in float32."""
    dtype = z.dtype
    z = ops.cast(z, "float32")
    mean = ops.mean(z, axis=-1, keepdims=True)
    var = ops.mean(ops.square(z - mean), axis=-1, keepdims=True)
    z = (z - mean) * ops.rsqrt(var + epsilon)
    z = z * ops.cast(gamma, "float32") + ops.cast(beta, "float32")
    return ops.cast(z, dtype)


@keras.saving.register_keras_serializable(package="keras_trm")
class LSTMLNCell(keras.layers.Layer, DropoutRNNCell):
    """One step of the layer-normalized LSTM (Ba et al. 2016, §3.1).

    Gates in the order ``(f, i, o, g)`` (forget, input, output, candidate)
    along the ``4 * units`` axis of ``kernel``, ``recurrent_kernel``, ``bias``:

        (f, i, o, g) = LN(W_h h_{t-1}; α1, β1) + LN(W_x x_t; α2, β2) + b
        c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
        h_t = σ(o) ⊙ tanh(LN(c_t; α3, β3))

    with ``LN(z; α, β) = α ⊙ (z - μ) / sqrt(σ² + ε) + β`` over the last axis
    of one example: the first two over the whole ``4 * units`` vector (one
    LN over the concatenated gates, as in the paper), the third over c_t.

    Weights, in ``get_weights()`` order: ``kernel`` ``(input_dim, 4*units)``
    (W_x), ``recurrent_kernel`` ``(units, 4*units)`` (W_h), ``bias``
    ``(4*units,)`` (b), ``recurrent_gamma``/``recurrent_beta``
    ``(4*units,)`` (α1, β1), ``input_gamma``/``input_beta`` ``(4*units,)``
    (α2, β2), ``cell_gamma``/``cell_beta`` ``(units,)`` (α3, β3). Gains
    start at 1 and LN biases at 0.

    Args:
        units: int > 0, the size of h_t and c_t.
        kernel_initializer, recurrent_initializer, bias_initializer:
            initializers of W_x, W_h and b.
        unit_forget_bias: bool; if True the forget-gate slice of b starts
            at 1 (the rest from ``bias_initializer``), as in
            ``keras.layers.LSTMCell``.
        kernel_regularizer, recurrent_regularizer, bias_regularizer:
            optional regularizers of W_x, W_h and b.
        dropout: float in [0, 1), dropout on x_t before W_x.
        recurrent_dropout: float in [0, 1), dropout on h_{t-1} before W_h
            (both masks drawn once per sequence, as in ``LSTMCell``).
        epsilon: float > 0 added to the variance in every LN.
        seed: optional int seed of the dropout masks.

    Call arguments:
        inputs: float tensor ``(batch, input_dim)``, x_t.
        states: list ``[h_{t-1}, c_{t-1}]``, each ``(batch, units)``.
        training: bool, enables dropout.

    Returns:
        ``(h_t, [h_t, c_t])``, each ``(batch, units)`` in the compute dtype
        (LN statistics are computed in float32).

    Raises:
        TypeError/ValueError: ``units`` not a positive int, ``dropout`` or
            ``recurrent_dropout`` outside [0, 1), ``epsilon`` not > 0, naming
            the argument and the value.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> rnn = keras.layers.RNN(LSTMLNCell(4))
    >>> x = np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32")
    >>> tuple(rnn(x).shape)
    (2, 4)
    """

    def __init__(self, units, kernel_initializer="glorot_uniform",
                 recurrent_initializer="orthogonal", bias_initializer="zeros",
                 unit_forget_bias=True, kernel_regularizer=None,
                 recurrent_regularizer=None, bias_regularizer=None, dropout=0.0,
                 recurrent_dropout=0.0, epsilon=1e-5, seed=None, **kwargs):
        units = v.positive_int("units", units)
        dropout = v.rate("dropout", dropout)
        recurrent_dropout = v.rate("recurrent_dropout", recurrent_dropout)
        epsilon = v.positive_float("epsilon", epsilon)
        super().__init__(**kwargs)
        self.units = units
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.recurrent_initializer = keras.initializers.get(recurrent_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.unit_forget_bias = bool(unit_forget_bias)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = keras.regularizers.get(recurrent_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.dropout = dropout
        self.recurrent_dropout = recurrent_dropout
        self.epsilon = epsilon
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed=seed)
        self.state_size = [units, units]
        self.output_size = units

    def build(self, input_shape):
        n = self.units
        self.kernel = self.add_weight(
            name="kernel", shape=(input_shape[-1], 4 * n),
            initializer=clone_initializer(self.kernel_initializer, 0),
            regularizer=self.kernel_regularizer)
        self.recurrent_kernel = self.add_weight(
            name="recurrent_kernel", shape=(n, 4 * n),
            initializer=clone_initializer(self.recurrent_initializer, 1),
            regularizer=self.recurrent_regularizer)
        base = clone_initializer(self.bias_initializer, 2)

        def forget_ones(shape, dtype=None):
            # Gate order (f, i, o, g): the forget slice comes first.
            return ops.concatenate([keras.initializers.Ones()((n,), dtype=dtype),
                                    base((3 * n,), dtype=dtype)])

        self.bias = self.add_weight(
            name="bias", shape=(4 * n,), regularizer=self.bias_regularizer,
            initializer=forget_ones if self.unit_forget_bias else base)
        for prefix, size in (("recurrent", 4 * n), ("input", 4 * n), ("cell", n)):
            for suffix, init in (("gamma", "ones"), ("beta", "zeros")):
                setattr(self, f"{prefix}_{suffix}", self.add_weight(
                    name=f"{prefix}_{suffix}", shape=(size,), initializer=init))

    def call(self, inputs, states, training=None):
        h_prev, c_prev = states[0], states[1]
        if training and self.dropout > 0.0:
            inputs = inputs * self.get_dropout_mask(inputs)
        if training and self.recurrent_dropout > 0.0:
            h_prev = h_prev * self.get_recurrent_dropout_mask(h_prev)
        eps = self.epsilon
        z = (_layer_norm(ops.matmul(h_prev, self.recurrent_kernel),
                         self.recurrent_gamma, self.recurrent_beta, eps)
             + _layer_norm(ops.matmul(inputs, self.kernel),
                           self.input_gamma, self.input_beta, eps))
        f, i, o, g = ops.split(z + self.bias, 4, axis=-1)
        c = ops.sigmoid(f) * c_prev + ops.sigmoid(i) * ops.tanh(g)
        h = ops.sigmoid(o) * ops.tanh(
            _layer_norm(c, self.cell_gamma, self.cell_beta, eps))
        return h, [h, c]

    def get_config(self):
        config = super().get_config()
        config.update({k: getattr(self, k) for k in (
            "units", "unit_forget_bias", "dropout", "recurrent_dropout", "epsilon",
            "seed")})
        config.update({k: keras.initializers.serialize(getattr(self, k))
                       for k in _INITIALIZERS})
        config.update({k: keras.regularizers.serialize(getattr(self, k))
                       for k in _REGULARIZERS})
        return config


@keras.saving.register_keras_serializable(package="keras_trm")
class LSTM_LN(keras.layers.RNN):
    """Layer-normalized LSTM over a sequence (Ba, Kiros and Hinton 2016).

    A ``keras.layers.RNN`` over ``LSTMLNCell`` (the cell documents the
    equations, the gate order ``(f, i, o, g)`` and the weight layout),
    built like ``keras.layers.LSTM`` but with tanh/sigmoid fixed as in the
    paper, no cuDNN path and always a bias. Keras masking (a masked step
    keeps the previous state), ``Bidirectional``, stateful use and
    ``.keras`` serialization work.

    Args:
        units: int > 0, the size of the hidden and cell states.
        return_sequences: bool, return every h_t instead of the last one.
        return_state: bool, also return the final ``h_T`` and ``c_T``.
        go_backwards: bool, process the sequence in reverse.
        stateful: bool, carry the last states of a batch to the next one.
        unroll: bool, unroll the time loop (short fixed-length sequences).
        **kwargs: ``LSTMLNCell``'s ``kernel_initializer``,
            ``recurrent_initializer``, ``bias_initializer``,
            ``unit_forget_bias``, ``kernel_regularizer``,
            ``recurrent_regularizer``, ``bias_regularizer``, ``dropout``,
            ``recurrent_dropout`` (rates in [0, 1)), ``epsilon`` (> 0) and
            ``seed``; other ``keras.layers.RNN`` / ``Layer`` arguments
            (``name``, ``dtype``, ``zero_output_for_mask``, ...).

    Call arguments:
        sequences: float tensor ``(batch, timesteps, features)``.
        initial_state: optional list ``[h_0, c_0]``, each ``(batch, units)``.
        mask: optional bool tensor ``(batch, timesteps)``; True = keep the
            step. Taken from the input's Keras mask when not given.
        training: bool, enables dropout.

    Returns:
        ``(batch, units)``, or ``(batch, timesteps, units)`` with
        ``return_sequences``, in the layer's compute dtype; with
        ``return_state`` the list ``[output, h_T, c_T]`` (states
        ``(batch, units)``).

    Raises:
        TypeError/ValueError: bad arguments, as ``LSTMLNCell``; ValueError for
            inputs that are not 3-D (``InputSpec(ndim=3)``), and for a
            ``mask`` or ``initial_state`` of another shape.

    Example:

    >>> import numpy as np
    >>> layer = LSTM_LN(8, return_sequences=True)
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32")
    >>> tuple(layer(x).shape)
    (2, 5, 8)
    >>> last, h, c = LSTM_LN(8, return_state=True)(x)
    >>> tuple(last.shape), tuple(c.shape)
    ((2, 8), (2, 8))
    """

    _CELL_KEYS = ("units", "unit_forget_bias", "dropout", "recurrent_dropout",
                  "epsilon", "seed") + _INITIALIZERS + _REGULARIZERS

    def __init__(self, units, return_sequences=False, return_state=False,
                 go_backwards=False, stateful=False, unroll=False, **kwargs):
        cell_kwargs = {k: kwargs.pop(k) for k in self._CELL_KEYS if k in kwargs}
        cell = LSTMLNCell(units, **cell_kwargs, dtype=kwargs.get("dtype"),
                          trainable=kwargs.get("trainable", True),
                          name="lstm_ln_cell")
        super().__init__(cell, return_sequences=return_sequences,
                         return_state=return_state, go_backwards=go_backwards,
                         stateful=stateful, unroll=unroll, **kwargs)
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def call(self, sequences, initial_state=None, mask=None, training=False):
        v.mask_shape("mask", mask, sequences.shape[:2], "(batch, timesteps)")
        if initial_state is not None:
            states = (initial_state if isinstance(initial_state, (list, tuple))
                      else [initial_state])
            if len(states) != 2:
                raise ValueError(
                    "`initial_state` must be the list [h_0, c_0], got "
                    f"{type(initial_state).__name__} of {len(states)}")
            for i, state in enumerate(states):
                v.mask_shape(f"initial_state[{i}]", state,
                             (sequences.shape[0], self.units), "(batch, units)")
        return super().call(sequences, initial_state=initial_state, mask=mask,
                            training=training)

    @property
    def units(self):
        return self.cell.units

    def get_config(self):
        config = super().get_config()
        del config["cell"]
        cell_config = self.cell.get_config()
        config.update({k: cell_config[k] for k in self._CELL_KEYS})
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
