"""Adam with one fused kernel per variable under TensorFlow.

Keras 3's ``Adam.update_step`` is written in ``keras.ops``: on TensorFlow
each variable's update runs as about a dozen element-wise ops (subtract,
multiply, ``assign_add`` for ``m``; square, subtract, multiply,
``assign_add`` for ``v``; multiply, sqrt, add, divide, ``assign_sub`` for
the variable), each reading and writing whole tensors, and each large one
handing its range to the intra-op thread pool and waiting on a barrier for
it. On a 2-core CPU those hand-offs are most of the training step's
``futex`` calls, hence of its kernel time. ``FusedAdam`` runs the same
update as TensorFlow's ``ResourceApplyAdam`` kernel: one pass over the
variable, its gradient and both moments.
"""

import keras
from keras import ops

# dtypes for which TensorFlow registers ResourceApplyAdam on CPU and GPU.
_FUSED_DTYPES = ("float16", "bfloat16", "float32", "float64")


@keras.saving.register_keras_serializable(package="keras_trm")
class FusedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose TensorFlow update is one
    ``ResourceApplyAdam`` kernel per variable (Kingma & Ba 2015,
    Algorithm 1 with the "epsilon hat" of §2, as Keras' Adam computes it):

        m_t = m + (1 - beta_1) (g - m)
        v_t = v + (1 - beta_2) (g^2 - v)
        alpha_t = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)
        variable -= alpha_t m_t / (sqrt(v_t) + epsilon)

    Same arguments, slots (``m``, ``v``), checkpoints and serialization as
    ``keras.optimizers.Adam``, plus ``weight_decay_exclude_names``: the
    variables whose name contains one of these strings (Keras'
    ``exclude_from_weight_decay(var_names=)``, kept in ``get_config`` so
    that a reloaded optimizer excludes the same ones) take no weight decay.
    Keras applies ``weight_decay`` before the update, decoupled from the
    gradient (Loshchilov & Hutter 2019, AdamW):
    ``variable -= lr * weight_decay * variable``. The update agrees with
    Keras' Adam to float rounding (the kernel evaluates the same expression
    in one fused loop). It falls
    back to Keras' own update for ``amsgrad=True``, on backends other than
    TensorFlow, for variable dtypes the kernel lacks (see ``_FUSED_DTYPES``)
    and for sparse (``tf.IndexedSlices``) gradients, which Keras' Adam
    applies to the moments' gathered rows only (the Transformer's tied
    embedding gets a dense gradient: its output projection is a matmul).
    Works under ``tf.distribute`` strategies (the update runs per replica
    inside ``Strategy.extended.update``, where a distributed variable's
    ``handle`` is that of the replica being updated) and with
    ``jit_compile=True`` (XLA has the kernel).

    Shapes and dtypes: each gradient has its variable's shape; variables of
    float16, bfloat16, float32 or float64 take the fused kernel (mixed
    precision keeps float32 variables), the gradient is cast to the
    variable's dtype. Units: ``learning_rate`` per step, as in Keras.

    Raises: nothing of its own; arguments are checked by
    ``keras.optimizers.Adam``.

    Why: on the Multi30k model's bf16 training epoch on a 2-core AVX-512
    CPU (``bench/bench_translation.py`` at 32da1ca), it took 4-7% off the epoch's wall
    time and 9% of its voluntary context switches (each large element-wise
    op is a thread-pool hand-off), in alternating runs of both.

    Example:

    >>> import numpy as np
    >>> opt = FusedAdam(1e-3, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    >>> w = keras.Variable(np.ones((2, 3), "float32"))
    >>> _ = opt.apply_gradients([(np.full((2, 3), 0.5, "float32"), w)])
    >>> [round(float(x), 6) for x in keras.ops.convert_to_numpy(w)[0]]  # 1 - lr
    [0.999, 0.999, 0.999]
    """

    def __init__(self, *args, weight_decay_exclude_names=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_decay_exclude_names = tuple(
            str(name) for name in weight_decay_exclude_names)
        if self.weight_decay_exclude_names:
            self.exclude_from_weight_decay(
                var_names=list(self.weight_decay_exclude_names))

    def get_config(self):
        return {**super().get_config(),
                "weight_decay_exclude_names": list(self.weight_decay_exclude_names)}

    def update_step(self, gradient, variable, learning_rate):
        if not self._fused(gradient, variable):
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        local_step = ops.cast(self.iterations + 1, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=ops.power(ops.cast(self.beta_1, dtype), local_step),
            beta2_power=ops.power(ops.cast(self.beta_2, dtype), local_step),
            lr=ops.cast(learning_rate, dtype),
            beta1=ops.cast(self.beta_1, dtype),
            beta2=ops.cast(self.beta_2, dtype),
            epsilon=ops.cast(self.epsilon, dtype),
            grad=ops.cast(gradient, dtype),
        )

    def _fused(self, gradient, variable):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return False
        import tensorflow as tf

        return (not isinstance(gradient, tf.IndexedSlices)
                and keras.backend.standardize_dtype(variable.dtype)
                in _FUSED_DTYPES)

