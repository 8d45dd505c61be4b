"""Truncation of token-id sequences to a model's length."""


def truncate_head_tail(ids, max_length):
    """Keeps at most ``max_length`` ids per row: the first ``max_length //
    4`` and the last ``max_length - max_length // 4`` (head + tail
    truncation, the best scheme of Sun et al. 2019, "How to Fine-Tune BERT
    for Text Classification?", §5.3.1).

    Args:
        ids: ragged int ``tf.RaggedTensor`` ``(batch, None)``.
        max_length: int > 0.

    Returns:
        ragged int ``(batch, None)``, rows of at most ``max_length`` ids;
        rows that fit are unchanged.

    Raises:
        TypeError: ``max_length`` not an int (a float, a bool, None).
        ValueError: ``max_length`` <= 0 (it would empty every row).

    Example:

    >>> import tensorflow as tf
    >>> ids = tf.ragged.constant([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2]])
    >>> truncate_head_tail(ids, 4).to_list()
    [[1, 7, 8, 9], [1, 2]]
    """
    import tensorflow as tf

    from keras_trm.utils import checks as v

    max_length = v.positive_int("max_length", max_length)
    head = max_length // 4
    tail = max_length - head
    lengths = ids.row_lengths()
    positions = tf.ragged.range(lengths)
    keep = (positions < head) | (positions >= tf.expand_dims(lengths - tail, 1))
    return tf.ragged.boolean_mask(ids, keep)
