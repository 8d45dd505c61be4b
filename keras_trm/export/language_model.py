"""SavedModel export of the Transformer-XL language model:
``TransformerXLServing`` (the exported ``tf.Module``), ``export_language_model``
(TF Serving's layout, vocabulary and config in ``assets.extra/``) and
``sample_text`` (generation from an export, ``keras-trm sample-lm``).
"""

import json
import os
import pathlib

import numpy as np
import tensorflow as tf

from keras_trm.export.saved_model import export_module
from keras_trm.utils import checks as v
from keras_trm.models.transformer_xl import TransformerXLLM


class TransformerXLServing(tf.Module):
    """The exported Transformer-XL LM: score or generate segment by segment.

    ``serve(token_ids, memories)``:

    * ``token_ids``: int32 ``(batch, seg_len)``, ``1 <= seg_len <=
      max_segment_len``;
    * ``memories``: float32 ``(num_layers, batch, M, d_model)``, the
      previous segment's ``new_memories``, or M = 0 at a stream's start;

    returns ``{"log_probs": float32 (batch, seg_len, vocabulary_size)``
    (natural-log next-token probabilities: row t predicts token t + 1),
    ``"new_memories": float32 (num_layers, batch, min(mem_len, M +
    seg_len), d_model)}``.

    Shapes other than these raise ``tf.errors.InvalidArgumentError``
    naming the argument and both shapes (checked in the graph: a loaded
    signature does not enforce its static shapes).

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
        # Padded with -1: a wrong rank fails the check, not an index.
        t_shape, m_shape = tf.shape(token_ids), tf.shape(memories)
        t = tf.concat([t_shape, [-1, -1]], 0)
        m = tf.concat([m_shape, [-1, -1, -1, -1]], 0)
        token_ok = tf.reduce_all(tf.stack([
            tf.equal(tf.size(t_shape), 2), t[1] >= 1, t[1] <= model.max_segment_len]))
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
            token_ids, memories = tf.identity(token_ids), tf.identity(memories)
        logits, new_memories = model(
            token_ids, tf.unstack(memories, num=model.num_layers),
            training=False)
        return {"log_probs": tf.nn.log_softmax(logits),
                "new_memories": tf.stack(new_memories)}


def export_language_model(model, vocabulary, export_dir, model_name,
                          extra_config=None, version=None):
    """Exports ``model`` (a ``TransformerXLLM``) with ``TransformerXLServing``.

    The signature ``serving_default`` is ``TransformerXLServing.serve``.
    ``assets.extra/`` holds ``vocab.json`` (the id -> token list; JSON keeps
    newline and space tokens) and ``config.json`` (model sizes, ``mem_len``,
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


EOS = "<eos>"
UNK = "<unk>"


def _token_level(config, tokens):
    """``"char"`` or ``"word"``: config.json's ``level`` where the job wrote
    it, else char when every token but ``<unk>`` / ``<eos>`` is one
    character."""
    if config.get("level") in ("char", "word"):
        return config["level"]
    return "char" if all(len(t) == 1 for t in tokens if t not in (UNK, EOS)) else "word"


def _encode(prompt, tokens, level):
    """The prompt's ids: one token per character, or whitespace words with
    each ``\\n`` as ``<eos>``; unknown tokens are ``<unk>`` where the
    vocabulary has it."""
    if level == "char":
        pieces = list(prompt)
    else:
        lines = prompt.split("\n")
        pieces = [t for i, line in enumerate(lines)
                  for t in line.split() + ([EOS] if i < len(lines) - 1 else [])]
    if not pieces:
        raise ValueError("`prompt` must hold at least one token, got "
                         f"prompt={prompt!r}")
    index = {t: i for i, t in enumerate(tokens)}
    missing = [(i, t) for i, t in enumerate(pieces) if t not in index]
    if missing and UNK not in index:
        position, token = missing[0]
        raise ValueError(
            f"`prompt` token {token!r} (token {position}) is not in the "
            f"export's vocabulary of {len(tokens)} tokens, which has no {UNK!r}")
    return [index.get(t, index.get(UNK)) for t in pieces], pieces[-1] == EOS


def _decode(ids, tokens, level, after_eos):
    """Generated ids -> text: characters joined; words after a space, or
    after nothing at the start of a line (``<eos>`` is a newline)."""
    if level == "char":
        return "".join(tokens[i] for i in ids)
    text = []
    for i in ids:
        token = tokens[i]
        text.append("\n" if token == EOS else (token if after_eos else " " + token))
        after_eos = token == EOS
    return "".join(text)


def _pick(log_probs, temperature, top_k, rng):
    """One id from ``log_probs`` (vocabulary,): argmax at temperature 0,
    else a draw from softmax(log_probs / temperature) over the ``top_k``
    most likely ids (all where 0)."""
    log_probs = np.asarray(log_probs, np.float64)
    if temperature == 0:
        return int(np.argmax(log_probs))
    scores = log_probs / temperature
    if top_k:
        # Stable: among equal scores the lowest id is kept, as argmax does.
        dropped = np.argsort(-scores, kind="stable")[top_k:]
        scores[dropped] = -np.inf
    probs = np.exp(scores - scores.max())
    return int(rng.choice(len(probs), p=probs / probs.sum()))


def sample_text(export_path, prompt, num_tokens, temperature=1.0, top_k=0,
                seed=0):
    """Generates text from an exported Transformer-XL LM, carrying its memories.

    Generation with segment memory (Dai et al. 2019, §3.2): the prompt is
    fed in segments of at most ``max_segment_len`` tokens, each with the
    ``new_memories`` of the one before; then each new token is fed alone
    with the memories, so no step recomputes the past. Token t + 1 is drawn
    from ``log_probs[:, -1]`` of the segment that ends at token t.

    Only the export is read (``serving_default``, ``assets.extra/vocab.json``
    and ``config.json``). The prompt is encoded with its vocabulary: one
    token per character (character level), or whitespace-separated words
    with each newline as ``<eos>`` (config.json's ``level``; without it, a
    vocabulary of single characters besides ``<unk>`` and ``<eos>`` is
    character-level). Unknown tokens become ``<unk>`` where it exists.

    Args:
        export_path: str or path-like, the version folder
            ``<export_dir>/<model_name>/<version>``.
        prompt: str, the text to continue (at least one token).
        num_tokens: int >= 1, tokens to generate.
        temperature: float >= 0 dividing the log-probabilities before
            sampling; 0 picks the most likely token (greedy).
        top_k: int >= 0: sample among the ``top_k`` most likely tokens
            (all where 0).
        seed: int >= 0, the seed of ``numpy.random.default_rng``.

    Returns:
        ``(text, ids)``: ``text`` the generated text, prompt excluded (a
        word-level model's words each follow a space, or start a line);
        ``ids`` int32 numpy array ``(num_tokens,)``, the generated ids.

    Raises:
        TypeError: ``export_path`` not a str or path, ``prompt`` not a
            str, ``num_tokens``, ``top_k`` or ``seed`` not an int,
            ``temperature`` not a number.
        ValueError: ``num_tokens`` < 1, ``temperature`` negative or not
            finite, ``top_k`` or ``seed`` negative; a prompt with no
            token, or with a token outside a vocabulary without ``<unk>``
            (naming the token).
        OSError: ``export_path`` is not a SavedModel folder with
            ``assets.extra/vocab.json`` and ``config.json``.

    Example:

    >>> import tempfile
    >>> from keras_trm.models import TransformerXLLM
    >>> from keras_trm.data.language_modeling import Vocabulary
    >>> lm = TransformerXLLM(4, num_layers=1, d_model=8, num_heads=2, d_ff=16,
    ...                      mem_len=4, max_segment_len=4)
    >>> path = export_language_model(lm, Vocabulary(["<unk>", "a", "b", " "]),
    ...                              tempfile.mkdtemp(), "tiny_lm")
    >>> text, ids = sample_text(path, "ab ba ab", num_tokens=6, seed=1)
    >>> ids.shape, ids.dtype, text == "".join(["<unk>", "a", "b", " "][i] for i in ids)
    ((6,), dtype('int32'), True)
    >>> greedy = sample_text(path, "abc", 3, temperature=0)[1]  # "c" is <unk>
    >>> bool((sample_text(path, "abc", 3, top_k=1, seed=5)[1] == greedy).all())
    True
    """
    if not isinstance(export_path, (str, os.PathLike)):
        raise TypeError("`export_path` must be a str or path, got "
                        f"export_path={export_path!r}")
    if not isinstance(prompt, str):
        raise TypeError(f"`prompt` must be a str, got prompt={prompt!r}")
    num_tokens = v.positive_int("num_tokens", num_tokens)
    temperature = v.non_negative_float("temperature", temperature)
    top_k = v.non_negative_int("top_k", top_k)
    seed = v.non_negative_int("seed", seed)
    assets = pathlib.Path(export_path) / "assets.extra"
    tokens = json.loads((assets / "vocab.json").read_text(encoding="utf-8"))
    config = json.loads((assets / "config.json").read_text(encoding="utf-8"))
    level = _token_level(config, tokens)
    prompt_ids, after_eos = _encode(prompt, tokens, level)

    serve = tf.saved_model.load(str(export_path)).signatures["serving_default"]
    seg_len = config["max_segment_len"]
    memories = tf.zeros((config["num_layers"], 1, 0, config["d_model"]))
    rng = np.random.default_rng(seed)
    for start in range(0, len(prompt_ids), seg_len):
        out = serve(token_ids=tf.constant([prompt_ids[start:start + seg_len]],
                                          tf.int32), memories=memories)
        memories = out["new_memories"]
    ids = [_pick(out["log_probs"][0, -1].numpy(), temperature, top_k, rng)]
    while len(ids) < num_tokens:
        out = serve(token_ids=tf.constant([[ids[-1]]], tf.int32), memories=memories)
        memories = out["new_memories"]
        ids.append(_pick(out["log_probs"][0, -1].numpy(), temperature, top_k, rng))
    return _decode(ids, tokens, level, after_eos), np.array(ids, np.int32)
