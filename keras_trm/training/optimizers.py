"""Adam with one fused kernel per variable under TensorFlow.

Keras 3's ``Adam.update_step`` runs, on TensorFlow, as about a dozen
element-wise ops per variable, each large one a hand-off to the intra-op
thread pool (most of the step's ``futex`` calls on a 2-core CPU).
``FusedAdam`` runs the same update as TensorFlow's ``ResourceApplyAdam``
kernel: one pass over the variable, its gradient and both moments.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_trm")
class FusedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose TensorFlow update is one
    ``ResourceApplyAdam`` kernel per variable (Kingma & Ba 2015,
    Algorithm 1 with the "epsilon hat" of §2, as Keras' Adam computes it):

        m_t = m + (1 - beta_1) (g - m)
        v_t = v + (1 - beta_2) (g^2 - v)
        alpha_t = lr sqrt(1 - beta_2^t) / (1 - beta_1^t)
        variable -= alpha_t m_t / (sqrt(v_t) + epsilon)

    Same arguments, slots, checkpoints and serialization as Keras' Adam,
    whose update it matches to float rounding, plus
    ``weight_decay_exclude_names``: variables whose name contains one of
    these strings take no (decoupled, AdamW) weight decay; kept in
    ``get_config``. Keras' own update runs instead for ``amsgrad=True``,
    other backends, other variable dtypes and sparse
    (``tf.IndexedSlices``) gradients. Works under ``tf.distribute`` (the
    update runs per replica) and with ``jit_compile=True``.

    Shapes and dtypes: each gradient has its variable's shape and is cast
    to its dtype; float16, bfloat16, float32 and float64 variables take the
    fused kernel. Units: ``learning_rate`` per step, as in Keras.

    Raises: nothing of its own; arguments are checked by Keras' Adam.

    Why: 4-7% off the Multi30k bf16 epoch on a 2-core AVX-512 CPU
    (``bench/bench_translation.py`` at 32da1ca), in alternating runs.

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
                in ("float16", "bfloat16", "float32", "float64"))
