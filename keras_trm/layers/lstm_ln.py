"""Layer-normalized LSTM (Ba, Kiros and Hinton 2016, §3.1 and Appendix).

The LN-LSTM of "Layer Normalization" (arXiv:1607.06450) normalizes the
input and recurrent contributions to the gates separately, and the cell
state before the output non-linearity:

    (f, i, o, g) = LN(W_h h_{t-1}; a1, b1) + LN(W_x x_t; a2, b2) + b
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h_t = sigmoid(o) * tanh(LN(c_t; a3, b3))

with ``LN(z; a, b) = a * (z - mean(z)) / sqrt(var(z) + epsilon) + b`` over
the last axis of one example. ``LSTMLNCell`` is the step, ``LSTM_LN`` the
``keras.layers.RNN`` over a sequence.
"""

import keras
from keras import ops

# Keras 3's per-sequence dropout masks, reset by keras.layers.RNN.
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import clone_initializer


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

    Per time step, with the gates in the order ``(f, i, o, g)`` (forget,
    input, output, candidate) along the ``4 * units`` axis of ``kernel``,
    ``recurrent_kernel`` and ``bias``:

        (f, i, o, g) = LN(W_h h_{t-1}; α1, β1) + LN(W_x x_t; α2, β2) + b
        c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
        h_t = σ(o) ⊙ tanh(LN(c_t; α3, β3))

    The first two LNs each normalize the whole ``4 * units`` vector (one LN
    over the concatenated gates, as in the paper); the third normalizes the
    ``units`` cell state. ``LN(z; α, β) = α ⊙ (z - μ) / sqrt(σ² + ε) + β``.

    Weights, in ``get_weights()`` order: ``kernel`` ``(input_dim, 4*units)``
    (W_x), ``recurrent_kernel`` ``(units, 4*units)`` (W_h), ``bias``
    ``(4*units,)`` (b), ``recurrent_gamma``/``recurrent_beta``
    ``(4*units,)`` (α1, β1), ``input_gamma``/``input_beta`` ``(4*units,)``
    (α2, β2), ``cell_gamma``/``cell_beta`` ``(units,)`` (α3, β3). Gains
    start at 1 and LN biases at 0.

    Args:
        units: int > 0, the size of h_t and c_t.
        kernel_initializer: initializer of W_x.
        recurrent_initializer: initializer of W_h.
        bias_initializer: initializer of b.
        unit_forget_bias: bool; if True the forget-gate slice of b starts
            at 1 (the rest from ``bias_initializer``), as in
            ``keras.layers.LSTMCell``.
        kernel_regularizer, recurrent_regularizer, bias_regularizer:
            optional regularizers of W_x, W_h and b.
        dropout: float in [0, 1), dropout on x_t before W_x.
        recurrent_dropout: float in [0, 1), dropout on h_{t-1} before W_h.
            Both masks are drawn once per sequence (the same at every step),
            as in ``keras.layers.LSTMCell``.
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
            ``recurrent_dropout`` outside [0, 1), ``epsilon`` not > 0; each
            message names the argument and the value received.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> rnn = keras.layers.RNN(LSTMLNCell(4))
    >>> x = np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32")
    >>> tuple(rnn(x).shape)
    (2, 4)
    """

    def __init__(
        self,
        units,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        unit_forget_bias=True,
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        epsilon=1e-5,
        seed=None,
        **kwargs,
    ):
        units = v.positive_int("units", units)
        dropout = v.rate("dropout", dropout)
        recurrent_dropout = v.rate("recurrent_dropout", recurrent_dropout)
        epsilon = v.positive_float("epsilon", epsilon)
        super().__init__(**kwargs)
        self.units = units
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.recurrent_initializer = keras.initializers.get(
            recurrent_initializer
        )
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.unit_forget_bias = bool(unit_forget_bias)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = keras.regularizers.get(
            recurrent_regularizer
        )
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.dropout = dropout
        self.recurrent_dropout = recurrent_dropout
        self.epsilon = epsilon
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed=seed)
        self.state_size = [units, units]
        self.output_size = units

    def build(self, input_shape):
        input_dim = input_shape[-1]
        n = self.units
        self.kernel = self.add_weight(
            name="kernel",
            shape=(input_dim, 4 * n),
            initializer=clone_initializer(self.kernel_initializer, 0),
            regularizer=self.kernel_regularizer,
        )
        self.recurrent_kernel = self.add_weight(
            name="recurrent_kernel",
            shape=(n, 4 * n),
            initializer=clone_initializer(self.recurrent_initializer, 1),
            regularizer=self.recurrent_regularizer,
        )
        if self.unit_forget_bias:
            base = clone_initializer(self.bias_initializer, 2)

            def bias_initializer(shape, dtype=None):
                # Gate order (f, i, o, g): the forget slice comes first.
                return ops.concatenate(
                    [
                        keras.initializers.Ones()((n,), dtype=dtype),
                        base((3 * n,), dtype=dtype),
                    ]
                )

        else:
            bias_initializer = clone_initializer(self.bias_initializer, 2)
        self.bias = self.add_weight(
            name="bias",
            shape=(4 * n,),
            initializer=bias_initializer,
            regularizer=self.bias_regularizer,
        )

        def ln_pair(prefix, size):
            gamma = self.add_weight(
                name=f"{prefix}_gamma", shape=(size,), initializer="ones"
            )
            beta = self.add_weight(
                name=f"{prefix}_beta", shape=(size,), initializer="zeros"
            )
            return gamma, beta

        self.recurrent_gamma, self.recurrent_beta = ln_pair("recurrent", 4 * n)
        self.input_gamma, self.input_beta = ln_pair("input", 4 * n)
        self.cell_gamma, self.cell_beta = ln_pair("cell", n)
        self.built = True

    def call(self, inputs, states, training=None):
        h_prev, c_prev = states[0], states[1]
        if training and self.dropout > 0.0:
            inputs = inputs * self.get_dropout_mask(inputs)
        if training and self.recurrent_dropout > 0.0:
            h_prev = h_prev * self.get_recurrent_dropout_mask(h_prev)

        z = _layer_norm(
            ops.matmul(h_prev, self.recurrent_kernel),
            self.recurrent_gamma,
            self.recurrent_beta,
            self.epsilon,
        ) + _layer_norm(
            ops.matmul(inputs, self.kernel),
            self.input_gamma,
            self.input_beta,
            self.epsilon,
        )
        z = z + self.bias
        f, i, o, g = ops.split(z, 4, axis=-1)
        c = ops.sigmoid(f) * c_prev + ops.sigmoid(i) * ops.tanh(g)
        c_norm = _layer_norm(c, self.cell_gamma, self.cell_beta, self.epsilon)
        h = ops.sigmoid(o) * ops.tanh(c_norm)
        return h, [h, c]

    def get_initial_state(self, batch_size=None):
        return [
            ops.zeros((batch_size, d), dtype=self.compute_dtype)
            for d in self.state_size
        ]

    def get_config(self):
        config = super().get_config()
        config.update(
            units=self.units,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
            recurrent_initializer=keras.initializers.serialize(
                self.recurrent_initializer
            ),
            bias_initializer=keras.initializers.serialize(
                self.bias_initializer
            ),
            unit_forget_bias=self.unit_forget_bias,
            kernel_regularizer=keras.regularizers.serialize(
                self.kernel_regularizer
            ),
            recurrent_regularizer=keras.regularizers.serialize(
                self.recurrent_regularizer
            ),
            bias_regularizer=keras.regularizers.serialize(
                self.bias_regularizer
            ),
            dropout=self.dropout,
            recurrent_dropout=self.recurrent_dropout,
            epsilon=self.epsilon,
            seed=self.seed,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_trm")
class LSTM_LN(keras.layers.RNN):
    """Layer-normalized LSTM over a sequence (Ba, Kiros and Hinton 2016).

    A ``keras.layers.RNN`` over ``LSTMLNCell``; see the cell for the
    equations, the gate order ``(f, i, o, g)`` and the weight layout:

        (f, i, o, g) = LN(W_h h_{t-1}; α1, β1) + LN(W_x x_t; α2, β2) + b
        c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
        h_t = σ(o) ⊙ tanh(LN(c_t; α3, β3))

    The constructor follows ``keras.layers.LSTM`` where that makes sense
    (the activations are fixed to tanh/sigmoid as in the paper, there is no
    cuDNN path and the layer always has a bias). Keras masking is supported
    (e.g. from ``Embedding(mask_zero=True)``: a masked step keeps the
    previous state), as are ``keras.layers.Bidirectional``, stateful use
    and ``.keras`` serialization.

    Args:
        units: int > 0, the size of the hidden and cell states.
        kernel_initializer: passed to ``LSTMLNCell``, as are
            ``recurrent_initializer``, ``bias_initializer``,
            ``unit_forget_bias``, ``kernel_regularizer``,
            ``recurrent_regularizer``, ``bias_regularizer``, ``dropout``,
            ``recurrent_dropout``, ``epsilon`` and ``seed`` (dropout rates
            in [0, 1), epsilon > 0).
        return_sequences: bool, return every h_t instead of the last one.
        return_state: bool, also return the final ``h_T`` and ``c_T``.
        go_backwards: bool, process the sequence in reverse.
        stateful: bool, carry the last states of a batch to the next one.
        unroll: bool, unroll the time loop (short fixed-length sequences).
        **kwargs: other ``keras.layers.RNN`` / ``Layer`` arguments
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
        TypeError/ValueError: ``units`` not a positive int, ``dropout`` or
            ``recurrent_dropout`` outside [0, 1), ``epsilon`` not > 0 (the
            message names the argument and value); ValueError (from the
            layer's ``InputSpec(ndim=3)``) for inputs that are not 3-D, and
            for a ``mask`` or ``initial_state`` of another shape.

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

    def __init__(
        self,
        units,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        unit_forget_bias=True,
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        dropout=0.0,
        recurrent_dropout=0.0,
        epsilon=1e-5,
        seed=None,
        return_sequences=False,
        return_state=False,
        go_backwards=False,
        stateful=False,
        unroll=False,
        **kwargs,
    ):
        cell = LSTMLNCell(
            units,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            bias_initializer=bias_initializer,
            unit_forget_bias=unit_forget_bias,
            kernel_regularizer=kernel_regularizer,
            recurrent_regularizer=recurrent_regularizer,
            bias_regularizer=bias_regularizer,
            dropout=dropout,
            recurrent_dropout=recurrent_dropout,
            epsilon=epsilon,
            seed=seed,
            dtype=kwargs.get("dtype"),
            trainable=kwargs.get("trainable", True),
            name="lstm_ln_cell",
        )
        super().__init__(
            cell,
            return_sequences=return_sequences,
            return_state=return_state,
            go_backwards=go_backwards,
            stateful=stateful,
            unroll=unroll,
            **kwargs,
        )
        self.input_spec = keras.layers.InputSpec(ndim=3)

    def call(self, sequences, initial_state=None, mask=None, training=False):
        v.mask_shape("mask", mask, sequences.shape[:2], "(batch, timesteps)")
        if initial_state is not None:
            if not isinstance(initial_state, (list, tuple)) or len(initial_state) != 2:
                raise ValueError(
                    "`initial_state` must be the list [h_0, c_0], got "
                    f"{type(initial_state).__name__} of "
                    f"{len(initial_state) if isinstance(initial_state, (list, tuple)) else 1}")
            for i, state in enumerate(initial_state):
                v.mask_shape(f"initial_state[{i}]", state,
                             (sequences.shape[0], self.units), "(batch, units)")
        return super().call(
            sequences, initial_state=initial_state, mask=mask, training=training
        )

    @property
    def units(self):
        return self.cell.units

    @property
    def dropout(self):
        return self.cell.dropout

    @property
    def recurrent_dropout(self):
        return self.cell.recurrent_dropout

    @property
    def epsilon(self):
        return self.cell.epsilon

    _CELL_KEYS = (
        "units",
        "kernel_initializer",
        "recurrent_initializer",
        "bias_initializer",
        "unit_forget_bias",
        "kernel_regularizer",
        "recurrent_regularizer",
        "bias_regularizer",
        "dropout",
        "recurrent_dropout",
        "epsilon",
        "seed",
    )

    def get_config(self):
        config = super().get_config()
        del config["cell"]
        cell_config = self.cell.get_config()
        config.update({k: cell_config[k] for k in self._CELL_KEYS})
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
