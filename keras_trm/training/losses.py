"""Label-smoothed cross-entropy over non-padding tokens."""

import keras
import numpy as np
from keras import ops

from keras_trm.utils import checks as v


@keras.saving.register_keras_serializable(package="keras_trm")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, averaged over real tokens.

    Vaswani et al. (2017) §5.4 use label smoothing ε_ls = 0.1 (Szegedy et al.
    2016): the target distribution puts 1 - ε on the label and ε / V on every
    one of the V classes, so with log-probabilities log p = log_softmax(z)

        loss_t = -(1 - ε) log p[y_t] - (ε / V) Σ_k log p[k]

    and the batch loss is Σ_t m_t loss_t / Σ_t m_t with m_t = [y_t != pad],
    computed as loss_t = logsumexp(z) - (1 - ε) z[y_t] - ε mean_k z_k (no
    (batch, T, V) tensor of log-probabilities, nor Keras' dense one-hot
    labels), its gradient softmax(z) - q written by hand.

    Data parallelism: the mean is over the real tokens of the *global*
    batch. Under ``tf.distribute`` each replica returns Σ_replica m_t loss_t
    / Σ_all m_t (one scalar all-reduce), so the replicas' summed gradients
    are those of the global token mean; under JAX's ``DataParallel`` the
    loss already sees the whole batch.

    Args:
        label_smoothing: ε in [0, 1).
        pad_id: int >= 0, label id that is ignored (0).

    Call arguments:
        y_true: integer ``(batch, T)`` labels: a tensor, NumPy array or
            nested list.
        y_pred: float ``(batch, T, V)`` logits.

    Returns:
        float32 scalar; 0 for a batch with no real token; NaN on every
        backend when a label given as a tensor lies outside [0, V) (say
        -100, PyTorch's "ignore" label).

    Raises:
        TypeError: ``pad_id`` not an int (bool refused); ``y_true`` of a
            float, bool or string dtype, naming the dtype.
        ValueError: label_smoothing outside [0, 1); ``pad_id`` negative; a
            ``sample_weight`` (the padding mask is the weighting); static
            shapes that are not ``(batch, T)`` and ``(batch, T, V)`` with
            the same batch and T, naming both; labels given as a NumPy
            array or a list with an id outside [0, V) (tensors are not read
            back from the device).

    Example:
    >>> import numpy as np
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    >>> labels = np.array([[1, 2, 0]])   # the last position is padding
    >>> uniform = np.zeros((1, 3, 4), "float32")
    >>> round(float(loss(labels, uniform)), 4)   # log V = log 4, whatever ε
    1.3863
    >>> confident = np.zeros((1, 3, 4), "float32")
    >>> confident[0, 0, 1] = confident[0, 1, 2] = 20.0
    >>> round(float(loss(labels, confident)), 2)   # > 0: ε keeps a floor
    1.5
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_ce",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = v.rate("label_smoothing", label_smoothing)
        self.pad_id = v.non_negative_int("pad_id", pad_id)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras' Loss.__call__ would weigh by the output's mask and divide by
        # the number of replicas; the token mean needs neither.
        if sample_weight is not None:
            raise ValueError(
                "LabelSmoothedCrossEntropy weighs tokens by the padding mask "
                f"(label pad_id={self.pad_id}) and takes no sample_weight, got "
                f"sample_weight of shape {ops.shape(sample_weight)}")
        # Host values are checked whole; tensors on their static dtype and
        # shapes only (nothing is copied back).
        if isinstance(y_true, (list, tuple)):
            y_true = np.asarray(y_true)
        if isinstance(y_pred, (list, tuple)):
            y_pred = np.asarray(y_pred, "float32")
        _check_labels_and_logits(y_true, y_pred)
        num_classes = ops.shape(y_pred)[-1]
        if isinstance(y_true, np.ndarray) and y_true.size and num_classes is not None:
            low, high = int(y_true.min()), int(y_true.max())
            if low < 0 or high >= num_classes:
                bad = low if low < 0 else high
                raise ValueError(
                    f"`y_true` holds label {bad}, outside [0, {num_classes}): "
                    f"the logits (y_pred) have V={num_classes} classes; padding "
                    f"is label pad_id={self.pad_id}")
        with keras.name_scope(self.name):
            return self.call(y_true, y_pred)

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        per_token = _smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        count = _global_sum(ops.sum(mask))
        return ops.sum(per_token * mask) / ops.maximum(count, 1.0)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing,
                "pad_id": self.pad_id}


def _static_shape(x):
    """``x``'s static shape as a tuple (None for unknown dimensions), or
    None when even its rank is unknown."""
    try:
        return tuple(None if d is None else int(d) for d in x.shape)
    except (AttributeError, TypeError, ValueError):
        return None


def _check_label_dtype(y_true):
    """The static dtype (no device read), once Keras is past its shape
    inference."""
    if hasattr(y_true, "dtype") and not v.in_symbolic_scope():
        v.integer_ids("y_true", y_true, what="integer labels (token ids)")


def _check_labels_and_logits(y_true, y_pred):
    """Integer ``(batch, T)`` labels for ``(batch, T, V)`` logits, checked
    on the dtype and the static shapes only (no device read)."""
    _check_label_dtype(y_true)
    labels, logits = _static_shape(y_true), _static_shape(y_pred)
    if labels is None or logits is None:
        return
    if (len(labels) != 2 or len(logits) != 3 or any(
            a is not None and b is not None and a != b
            for a, b in zip(labels, logits[:2]))):
        raise ValueError(
            "`y_true` must be (batch, T) labels for `y_pred` (batch, T, V) "
            f"logits, got y_true of shape {labels} and y_pred of shape {logits}")


def _smoothed_cross_entropy(labels, logits, label_smoothing):
    """Per-token label-smoothed cross-entropy, float32 ``(batch, T)``, with
    the gradient d loss_t / d z = softmax(z) - q, q = (1 - ε) one_hot(y_t)
    + ε / V, written by hand: no one-hot and no saved ``(batch, T, V)``
    tensor, (softmax(z) - ε / V) x upstream then a scatter at the labels.
    That cut the TensorFlow step's peak memory from 693 to 609 MiB and the
    loss's value-and-gradient time by ~20% against autodiff
    (docs/measurements.md, "The loss's memory", "The loss's gradient by
    hand"). A label outside [0, V) gives a NaN loss on every backend.
    """
    num_classes = ops.shape(logits)[-1]
    eps = label_smoothing
    valid = ops.logical_and(ops.greater_equal(labels, 0),
                            ops.less(labels, num_classes))
    safe_labels = ops.where(valid, labels, 0)
    # (batch * T, 3) coordinates (row, position, label) of every label.
    batch, length = ops.shape(labels)[0], ops.shape(labels)[1]
    rows = ops.broadcast_to(ops.expand_dims(ops.arange(batch), 1), (batch, length))
    positions = ops.broadcast_to(ops.expand_dims(ops.arange(length), 0), (batch, length))
    label_index = ops.reshape(
        ops.stack([rows, positions, ops.cast(safe_labels, rows.dtype)], axis=-1), (-1, 3))

    @ops.custom_gradient
    def forward(logits):
        z = ops.cast(logits, "float32")
        lse = ops.logsumexp(z, axis=-1)
        label_logit = ops.take_along_axis(
            z, ops.expand_dims(safe_labels, -1), axis=-1)[..., 0]
        per_token = (lse - (1.0 - eps) * ops.where(valid, label_logit, float("nan"))
                     - eps * ops.mean(z, axis=-1))

        def grad(*args, upstream=None):
            if upstream is None:  # TensorFlow passes it positionally
                (upstream,) = args
            upstream = ops.cast(upstream, "float32")
            probs = ops.exp(ops.cast(logits, "float32") - ops.expand_dims(lse, -1))
            d_logits = ops.cast(
                (probs - eps / num_classes) * ops.expand_dims(upstream, -1),
                logits.dtype)
            # The same float32 expression, in the same order, at the labels.
            target = ops.where(valid, 1.0 - eps, 0.0)
            at_label = ((ops.exp(label_logit - lse) - target - eps / num_classes)
                        * upstream)
            return ops.scatter_update(d_logits, label_index, ops.cast(
                ops.reshape(at_label, (-1,)), logits.dtype))

        return per_token, grad

    return forward(logits)


def _global_sum(value):
    """``value`` summed over the replicas of a ``tf.distribute`` strategy;
    ``value`` itself elsewhere."""
    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


@keras.saving.register_keras_serializable(package="keras_trm")
class MaskedAccuracy(keras.metrics.Mean):
    """Next-token accuracy over non-padding labels.

    Args:
        pad_id: int >= 0, the label id that is not counted (0).

    Raises:
        TypeError: ``pad_id`` not an int (bool refused); in
            ``update_state``, ``y_true`` of a float, bool or string dtype.
        ValueError: ``pad_id`` negative.

    Example:
    >>> import numpy as np
    >>> metric = MaskedAccuracy()
    >>> labels = np.array([[1, 2, 0]])
    >>> logits = np.eye(4, dtype="float32")[[[1, 3, 0]]]   # right, wrong, padding
    >>> _ = metric.update_state(labels, logits)
    >>> float(metric.result())
    0.5
    """

    def __init__(self, pad_id=0, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = v.non_negative_int("pad_id", pad_id)

    def update_state(self, y_true, y_pred, sample_weight=None):
        if isinstance(y_true, (list, tuple)):
            y_true = np.asarray(y_true)
        _check_label_dtype(y_true)
        y_true = ops.cast(y_true, "int32")
        correct = ops.cast(
            ops.equal(ops.cast(ops.argmax(y_pred, -1), "int32"), y_true),
            "float32",
        )
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        return super().update_state(correct, sample_weight=mask)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}
