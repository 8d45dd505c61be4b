"""SavedModel export of the Transformer-XL language model.

``TransformerXLServing`` is the ``tf.Module`` whose ``serve`` signature the
export holds (token ids and memories in, log-probabilities and new memories
out); ``export_language_model`` writes it in TF Serving's
``<export_dir>/<model_name>/<version>/`` layout with the vocabulary and the
config in ``assets.extra/``.
"""

import json

import tensorflow as tf

from keras_trm.export.saved_model import export_module
from keras_trm.models.transformer_xl import TransformerXLLM


class TransformerXLServing(tf.Module):
    """The exported Transformer-XL LM: score or generate segment by segment.

    ``serve(token_ids, memories)``:

    * ``token_ids``: int32 ``(batch, seg_len)``, ``1 <= seg_len <=
      max_segment_len``;
    * ``memories``: float32 ``(num_layers, batch, M, d_model)``, the
      ``new_memories`` of the previous segment of the same streams, or
      ``zeros((num_layers, batch, 0, d_model))`` at the start of a stream
      (any M >= 0);

    returns ``{"log_probs": float32 (batch, seg_len, vocabulary_size)``
    (natural-log next-token probabilities: row t predicts token t + 1),
    ``"new_memories": float32 (num_layers, batch, min(mem_len, M +
    seg_len), d_model)}``.

    Bad input raises ``tf.errors.InvalidArgumentError`` whose message names
    the argument and both shapes, checked in the graph before the model
    runs (a loaded signature does not enforce its static shapes): a
    segment longer than ``max_segment_len`` or empty, ``token_ids`` not of
    rank 2, ``memories`` not of rank 4, or with another ``num_layers``,
    ``d_model`` or batch size than ``token_ids``.

    Example:

    >>> import tensorflow as tf
    >>> from keras_trm.models import TransformerXLLM
    >>> serving = TransformerXLServing(TransformerXLLM(
    ...     11, num_layers=1, d_model=8, num_heads=2, d_ff=16, mem_len=4,
    ...     max_segment_len=4))
    >>> out = serving.serve(tf.ones((2, 3), tf.int32), tf.zeros((1, 2, 0, 8)))
    >>> tuple(out["log_probs"].shape), tuple(out["new_memories"].shape)
    ((2, 3, 11), (1, 2, 3, 8))
    """

    def __init__(self, model):
        super().__init__(name="transformer_xl_serving")
        if not isinstance(model, TransformerXLLM):
            raise TypeError(
                "`model` must be a TransformerXLLM, got "
                f"{type(model).__name__}")
        self.model = model
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec([model.num_layers, None, None, model.d_model],
                          tf.float32, name="memories"),
        ])

    def _serve(self, token_ids, memories):
        model = self.model
        # Shapes padded with -1 so that a wrong rank fails the check below
        # instead of an index error.
        t_shape = tf.shape(token_ids)
        m_shape = tf.shape(memories)
        t = tf.concat([t_shape, [-1, -1]], 0)
        m = tf.concat([m_shape, [-1, -1, -1, -1]], 0)
        token_ok = tf.logical_and(
            tf.equal(tf.size(t_shape), 2),
            tf.logical_and(t[1] >= 1, t[1] <= model.max_segment_len))
        memory_ok = tf.reduce_all(tf.stack([
            tf.equal(tf.size(m_shape), 4),
            tf.equal(m[0], model.num_layers),
            tf.equal(m[1], t[0]),
            m[2] >= 0,
            tf.equal(m[3], model.d_model),
        ]))
        token_check = tf.debugging.Assert(token_ok, [
            "`token_ids` must have shape (batch, seg_len) with 1 <= seg_len "
            f"<= max_segment_len={model.max_segment_len}; got "
            "token_ids.shape=", t_shape], summarize=8)
        with tf.control_dependencies([token_check]):
            memory_check = tf.debugging.Assert(memory_ok, [
                f"`memories` must have shape (num_layers={model.num_layers}, "
                f"batch, M, d_model={model.d_model}) with the batch size of "
                "token_ids; got memories.shape=", m_shape,
                "and token_ids.shape=", t_shape], summarize=8)
        with tf.control_dependencies([token_check, memory_check]):
            token_ids = tf.identity(token_ids)
            memories = tf.identity(memories)
        logits, new_memories = model(
            token_ids, tf.unstack(memories, num=model.num_layers),
            training=False)
        return {"log_probs": tf.nn.log_softmax(logits),
                "new_memories": tf.stack(new_memories)}


def export_language_model(model, vocabulary, export_dir, model_name,
                          extra_config=None, version=None):
    """Exports ``model`` (a ``TransformerXLLM``) with ``TransformerXLServing``.

    The signature ``serving_default`` is ``TransformerXLServing.serve``; the
    new memories keep ``model.mem_len`` positions. ``assets.extra/`` holds
    ``vocab.json`` (the id -> token list; JSON so that newline and space
    characters survive) and ``config.json`` (model sizes, ``mem_len``,
    ``max_segment_len`` and ``extra_config``).

    Returns:
        ``pathlib.Path`` of ``<export_dir>/<model_name>/<version>``.

    Raises:
        TypeError: ``model`` is not a ``TransformerXLLM``; ``model_name``
            not a str, ``version`` not an int (see ``export_module``).
        ValueError: ``model_name`` not a plain folder name, ``version``
            negative (see ``export_module``).
        FileExistsError: the version folder exists.

    Example:

    >>> import tempfile
    >>> from keras_trm.data.language_modeling import Vocabulary
    >>> from keras_trm.models import TransformerXLLM
    >>> vocabulary = Vocabulary(["<unk>", "a", "b"])
    >>> lm = TransformerXLLM(len(vocabulary.tokens), num_layers=1, d_model=8,
    ...                      num_heads=2, d_ff=16, mem_len=4, max_segment_len=4)
    >>> path = export_language_model(lm, vocabulary, tempfile.mkdtemp(),
    ...                              "tiny_lm")
    >>> path.parent.name, path.name, sorted(p.name for p in (path / "assets.extra").iterdir())
    ('tiny_lm', '1', ['config.json', 'vocab.json'])
    """
    serving = TransformerXLServing(model)
    config = {
        "num_layers": model.num_layers, "d_model": model.d_model,
        "vocabulary_size": model.vocabulary_size, "mem_len": model.mem_len,
        "max_segment_len": model.max_segment_len,
        "signature": {
            "inputs": {"token_ids": "int32 (batch, seg_len)",
                       "memories": "float32 (num_layers, batch, M, d_model)"},
            "outputs": {"log_probs": "float32 (batch, seg_len, vocabulary_size)",
                        "new_memories": "float32 (num_layers, batch, "
                                        "min(mem_len, M + seg_len), d_model)"},
        },
        **(extra_config or {}),
    }
    return export_module(
        serving, export_dir, model_name,
        signatures={"serving_default": serving.serve}, version=version,
        assets={"vocab.json": json.dumps(vocabulary.tokens, ensure_ascii=False),
                "config.json": json.dumps(config, indent=1)},
    )
