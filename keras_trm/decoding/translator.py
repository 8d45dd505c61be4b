"""Raw text in, translated text out: tokenizer, search and detokenizer in
one TensorFlow graph (``Translator.translate``, the function a SavedModel
serves), or the backend's search between a host tokenizer and detokenizer
(``Translator.translate_texts``, ``GreedyBleu``), which needs no TensorFlow
under JAX and PyTorch."""

import keras
import numpy as np
from keras import ops

from keras_trm.decoding.bleu import corpus_bleu
from keras_trm.decoding.search import (GreedySearch, _check_special_ids,
                                      check_search, encode_by_length)
from keras_trm.models.transformer import as_transformer
from keras_trm.training.precision import float32_copy
from keras_trm.utils import ids as reserved
from keras_trm.utils import checks as v

_TENSORFLOW = keras.backend.backend() == "tensorflow"
if _TENSORFLOW:  # the graph a SavedModel serves
    import tensorflow as tf

    _Base = tf.Module
else:  # JAX, PyTorch: no TensorFlow imported

    class _Base:
        """What ``Translator`` keeps of ``tf.Module`` off TensorFlow."""

        def __init__(self, name=None):
            self._name = name

        @property
        def name(self):
            return self._name

# The whitespace ``tf.strings.strip`` removes (ASCII): a sentence of only
# these translates to "" on every path.
_ASCII_SPACE = " \t\n\v\f\r"


def _on_host(tokenizer):
    """A host tokenizer (``HostSentencePieceTokenizer``: lists of str in,
    numpy ids out) has ``encode``; the in-graph ones do not."""
    return callable(getattr(tokenizer, "encode", None))


def _check_vocabulary_sizes(model, tokenizer):
    """The tokenizer's vocabulary against the model's target and source
    vocabularies (where the tokenizer tells its size): the translator
    feeds the tokenizer's ids to the encoder and detokenizes the model's
    output ids with it. A model's output past the tokenizer's vocabulary
    crashed the detokenizer (a segfault, not an exception), and source ids
    past the model's source vocabulary read a row of NaN (JAX) or fail
    in the embedding."""
    size = getattr(tokenizer, "vocabulary_size", None)
    if size is None:
        return
    size = int(size)
    sides = {"target": model.target_vocabulary_size,
             "source": model.source_embedding.vocabulary_size}
    for side, model_size in sides.items():
        if int(model_size) != size:
            raise ValueError(
                f"`tokenizer` has {size} tokens (vocabulary_size={size}) but "
                f"the model's {side} vocabulary has {model_size}: translate "
                "with the tokenizer the model was trained with")


_FLAT_SEARCH_SETTINGS = ("beam_size", "length_penalty", "early_stopping",
                         "length_penalty_alpha")


def _refuse_flat_search_settings(removed):
    """A ``TypeError`` for arguments a translator does not take, naming the
    strategy that replaces the search settings once passed one by one."""
    if not removed:
        return
    name, value = next(iter(removed.items()))
    if name in _FLAT_SEARCH_SETTINGS:
        setting = {"length_penalty_alpha": "length_penalty"}.get(name, name)
        raise TypeError(
            f"`{name}` is a setting of the search strategy now, got "
            f"{name}={value!r}: pass search=BeamSearch({setting}=...) "
            "(keras_trm.decoding; GreedySearch() for a beam of 1)")
    raise TypeError(f"unexpected argument `{name}` ({name}={value!r})")


class Translator(_Base):
    """Translates batches of raw strings with a ``transformer()`` model.

    Under the TensorFlow backend a ``tf.Module`` (what a SavedModel
    serves); under JAX and PyTorch a plain object that imports no
    TensorFlow when its tokenizer is a host one.

    Args:
        model: a model built by ``keras_trm.models.transformer``.
        tokenizer: ``keras_trm.text.HostSentencePieceTokenizer`` (no
            TensorFlow; ``translate_texts`` only) or an in-graph tokenizer,
            ``keras_trm.text.TextTokenizer`` (shared vocabulary) or
            ``SentencePieceTokenizer`` (TensorFlow; what ``translate``
            and the exports need), of ``vocabulary_size`` the model's
            source and target vocabulary size; its ``start_id``,
            ``end_id`` and ``pad_id`` are the searches' special ids (the
            reserved ids where it has none).
        search: a ``SearchStrategy``: ``BeamSearch(beam_size, length_penalty,
            early_stopping)`` or ``GreedySearch()`` (default: the paper's
            ``BeamSearch(beam_size=4, length_penalty=0.6)``).
        max_source_length: int in [2, the model's max_sequence_length],
            source tokens kept, END included (default None: the model's
            max_sequence_length). Longer inputs are truncated to their first
            ``max_source_length - 1`` subword tokens.
        jit_compile: run the search compiled whole by XLA, over fixed-size
            caches (``static_cache=True``), the source padded to a multiple
            of 8 tokens so that XLA compiles once per 8 source lengths
            (about 2 s each on a 2-core CPU). On CPU it pays for single
            sentences and costs at large batches (no sentence leaves the
            batch): ``bench/results/decoding_xla.json``. Default False.
        jit_compile_max_batch_size: with ``jit_compile``, only batches of
            at most this many sentences run the XLA search, larger ones the
            graph search (one SavedModel fast for single requests and for
            batches; both give the same ids; XLA runs on the intra-op
            thread pool, so it pays with intra-op threads > 1:
            ``bench/results/serving_xla_batch1.json``). None (default):
            every batch.
        parallel_searches: int >= 1. The batch is dealt into this many
            parts, by source length (the i-th shortest sentence goes to part
            i mod n, so that the parts take about as many steps), and each
            part is searched on its own; TensorFlow runs them at once when
            its inter-op thread pool has that many threads (TF Serving's
            default: one per core), which pays because one search's many
            small ops and 100-row matmuls keep a second core mostly idle.
            Each sentence's ids are those of the whole-batch search (its
            search never looks at other sentences; tested). 2 parts on 2
            cores (intra-op 1, inter-op 2): 1.60x one search's beam 4
            (``bench/results/decoding_parallel.json``). With inter-op
            parallelism 1 the parts run one after another, 17% to 28%
            slower than one search in our runs; behind a server with
            concurrent requests (the cores already busy) 2 parts served
            0.80x (``bench/results/serving_parallel_searches.json``).
            Default 1.
        encode_groups: int >= 1. The source sentences are encoded in this
            many groups of similar length, each padded only to its own
            longest (``encode_by_length``; 1: the whole batch at its
            longest). Less padding, the same ids (1,000 of 1,000 Multi30k
            val and test sentences); with 4 groups on 2 cores greedy ran
            1.04x to 1.15x and beam 4 1.02x to 1.07x faster
            (``bench/results/encode_by_length.json``). Not used with
            ``jit_compile`` (static shapes). Default 4.

    Raises:
        ValueError: a tokenizer whose ``vocabulary_size`` is not the
            model's target and source vocabulary size, tokenizer special
            ids outside the target vocabulary, a ``max_source_length``
            (when given) outside [2, max_sequence_length], a search whose
            ``max_decoding_length`` is past the model's positions,
            ``parallel_searches``, ``encode_groups`` or
            ``jit_compile_max_batch_size`` (when given) < 1, or
            ``jit_compile_max_batch_size`` without ``jit_compile``.
        TypeError: ``search`` not a ``SearchStrategy`` (the old
            ``beam_size``, ``length_penalty`` and ``early_stopping``
            arguments are named with the strategy to use instead), a
            non-bool ``jit_compile``, ``max_source_length``,
            ``parallel_searches``, ``encode_groups`` or
            ``jit_compile_max_batch_size`` not an int (a float or bool
            included).

    ``translate(sentences)``: str ``(batch,)`` -> str ``(batch,)``. An empty
    (or all-whitespace) sentence translates to the empty string. It is a
    TensorFlow graph, so it needs the TensorFlow backend and an in-graph
    tokenizer; under JAX or PyTorch, or with a host tokenizer, use
    ``translate_texts``, which gives the same translations (the search runs
    on the backend, compiled by ``jax.jit`` on JAX, the source padded to a
    multiple of 8 tokens as with ``jit_compile``; tested against
    ``translate`` with TensorFlow blocked, tests/test_host_translation.py).

    Example:

    >>> import tensorflow as tf
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import RESERVED_TOKENS, TextTokenizer
    >>> vocab = list(RESERVED_TOKENS) + ["a", "dog", "runs", ".", "ein", "Hund"]
    >>> model = transformer(len(vocab), num_layers=1, d_model=16, num_heads=2,
    ...                     d_ff=32, max_sequence_length=12)
    >>> from keras_trm.decoding import BeamSearch
    >>> translator = Translator(model, TextTokenizer(vocab),
    ...                         search=BeamSearch(beam_size=2))
    >>> out = translator.translate(tf.constant(["a dog runs .", "  "]))
    >>> tuple(out.shape), out.dtype.name, out[1].numpy()   # empty in, empty out
    ((2,), 'string', b'')
    """

    def __init__(self, model, tokenizer, search=None, max_source_length=None,
                 jit_compile=False, parallel_searches=1, encode_groups=4,
                 jit_compile_max_batch_size=None, name=None, **removed):
        _refuse_flat_search_settings(removed)
        super().__init__(name=name)
        self.model = as_transformer(model)
        self.tokenizer = tokenizer
        _check_vocabulary_sizes(self.model, tokenizer)
        # The searches' special ids: the tokenizer's own, checked now
        # against the target vocabulary (not at the first translate).
        self.start_id, self.end_id, self.pad_id = _check_special_ids(
            self.model, *(getattr(tokenizer, name, default)
                          for name, default in (
                              ("start_id", reserved.START_ID),
                              ("end_id", reserved.END_ID),
                              ("pad_id", reserved.PAD_ID))))
        self.search = check_search(self.model, search)
        limit = self.model.max_sequence_length
        if max_source_length is None:
            self.max_source_length = limit
        else:
            self.max_source_length = v.positive_int("max_source_length",
                                                    max_source_length)
            if not 1 < self.max_source_length <= limit:
                raise ValueError(
                    f"`max_source_length` must be an int in [2, {limit}] "
                    f"(the model's max_sequence_length), got "
                    f"max_source_length={max_source_length!r}"
                )
        self.jit_compile = v.boolean("jit_compile", jit_compile)
        self.parallel_searches = v.positive_int("parallel_searches",
                                                parallel_searches)
        self.encode_groups = v.positive_int("encode_groups", encode_groups)
        if jit_compile_max_batch_size is not None:
            if not jit_compile:
                raise ValueError(
                    "`jit_compile_max_batch_size` needs jit_compile=True, got "
                    f"jit_compile_max_batch_size={jit_compile_max_batch_size!r}"
                    " with jit_compile=False")
            jit_compile_max_batch_size = v.positive_int(
                "jit_compile_max_batch_size", jit_compile_max_batch_size)
        self.jit_compile_max_batch_size = jit_compile_max_batch_size
        self._compiled_search = self._ids_graph = None
        if self.jit_compile and _TENSORFLOW:
            self._compiled_search = tf.function(
                lambda tokens: self._search(tokens, static_cache=True),
                jit_compile=True)

    def encode_text(self, sentences):
        """str ``(batch,)`` -> int32 ``(batch, T)``: ids + END, padded with
        the tokenizer's ``pad_id`` (TensorFlow ops, an in-graph
        tokenizer)."""
        import tensorflow as tf

        ids = self.tokenizer.tokenize(sentences)
        ids = ids[:, : self.max_source_length - 1]
        end = tf.fill([ids.nrows(), 1], self.end_id)
        ids = tf.concat([ids, tf.RaggedTensor.from_tensor(end)], axis=1)
        return ids.to_tensor(default_value=self.pad_id)

    def _search(self, encoder_tokens, static_cache=False):
        encoder_outputs = None
        if not static_cache:
            encoder_outputs = encode_by_length(self.model, encoder_tokens,
                                               self.encode_groups,
                                               pad_id=self.pad_id)
        return self.search(self.model, encoder_tokens, encoder_outputs,
                           start_id=self.start_id, end_id=self.end_id,
                           pad_id=self.pad_id, static_cache=static_cache)

    def generate_ids(self, encoder_tokens):
        """int ``(batch, T)`` ids + END, padded with ``pad_id`` -> int32
        ``(batch, steps)`` ids (``pad_id`` after END)."""
        parts = self.parallel_searches
        if parts == 1:
            return self._search_batch(encoder_tokens)
        # Sentences sorted by source length, dealt round-robin. Every part
        # keeps the batch's width, so each row is computed as in one search
        # (and gets the same number of steps, ``steps`` depending on it).
        lengths = tf.reduce_sum(
            tf.cast(tf.not_equal(encoder_tokens, self.pad_id), tf.int32), 1)
        order = tf.argsort(lengths, stable=True)
        rows = [order[i::parts] for i in range(parts)]
        outs = [self._search_batch(tf.gather(encoder_tokens, r)) for r in rows]
        width = tf.reduce_max(tf.stack([tf.shape(o)[1] for o in outs]))
        outs = [tf.pad(o, [[0, 0], [0, width - tf.shape(o)[1]]],
                       constant_values=self.pad_id) for o in outs]
        return tf.dynamic_stitch(rows, outs)

    def _search_batch(self, encoder_tokens):
        if not self.jit_compile:
            return self._search(encoder_tokens)
        limit = self.jit_compile_max_batch_size
        if limit is None:
            return self._compiled(encoder_tokens)
        # The output widths differ (the XLA search pads the source); the ids
        # are the same and PAD follows END either way.
        return tf.cond(tf.shape(encoder_tokens)[0] <= limit,
                       lambda: self._compiled(encoder_tokens),
                       lambda: self._search(encoder_tokens))

    def source_ids(self, sentences):
        """The encoder's input on the host: list of str -> int32 numpy
        ``(batch, T)``, each sentence's ids (its first
        ``max_source_length - 1``) + END, padded with ``pad_id`` (the ids
        of ``encode_text``).

        Example:

        >>> import pathlib, tempfile
        >>> from keras_trm.models import transformer
        >>> from keras_trm.text import HostSentencePieceTokenizer, learn_sentencepiece
        >>> path = learn_sentencepiece(["a dog runs.", "ein Hund läuft."] * 20, 280,
        ...                            pathlib.Path(tempfile.mkdtemp()) / "sp.model")
        >>> tokenizer = HostSentencePieceTokenizer(path)
        >>> model = transformer(tokenizer.vocabulary_size, num_layers=1,
        ...                     d_model=8, num_heads=2, d_ff=8, max_sequence_length=4)
        >>> ids = Translator(model, tokenizer).source_ids(["a dog runs.", ""])
        >>> ids.shape, ids.dtype.name, ids[1].tolist()   # "": END, then PAD
        ((2, 4), 'int32', [3, 0, 0, 0])
        """
        if not _on_host(self.tokenizer):
            import tensorflow as tf

            return self.encode_text(tf.constant(list(sentences), tf.string)).numpy()
        rows = self.tokenizer.encode(list(sentences))
        keep = self.max_source_length - 1
        width = max([min(len(row), keep) for row in rows], default=0) + 1
        ids = np.full((len(rows), width), self.pad_id, np.int32)
        for i, row in enumerate(rows):
            row = row[:keep]
            ids[i, :len(row)] = row
            ids[i, len(row)] = self.end_id
        return ids

    def compiled_width(self, width):
        """The source width the XLA search (``jit_compile``) runs at for a
        batch of source ids ``width`` tokens wide (END included): rounded
        up to a multiple of 8, at most the model's ``max_sequence_length``. XLA
        compiles once per width (and batch size), so once per 8 lengths
        instead of once per length; padding only adds masked positions.

        Args:
            width: int or int tensor (any shape), source tokens.

        Returns:
            int32 tensor of ``width``'s shape.

        Example:

        >>> from keras_trm.models import transformer
        >>> from keras_trm.text import TextTokenizer
        >>> model = transformer(8, num_layers=1, d_model=8, num_heads=2,
        ...                     d_ff=8, max_sequence_length=20)
        >>> vocab = ["[PAD]", "[UNK]", "[START]", "[END]", "a", "b", "c", "d"]
        >>> translator = Translator(model, TextTokenizer(vocab))
        >>> ops.convert_to_numpy(translator.compiled_width([1, 8, 9, 17])).tolist()
        [8, 8, 16, 20]
        """
        width = ops.convert_to_tensor(width, "int32")
        return ops.minimum((width + 7) // 8 * 8, self.model.max_sequence_length)

    def _compiled(self, encoder_tokens):
        # The same ids as unpadded up to float rounding (1000 of 1000 equal
        # in bench/results/decoding_xla_runtimes.json).
        width = tf.shape(encoder_tokens)[1]
        padded = self.compiled_width(width)
        return self._compiled_search(
            tf.pad(encoder_tokens, [[0, 0], [0, padded - width]],
                   constant_values=self.pad_id))

    if _TENSORFLOW:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def translate(self, sentences):
            tokens = self.encode_text(sentences)
            text = self.tokenizer.detokenize(self.generate_ids(tokens))
            is_empty = tf.equal(tf.strings.length(tf.strings.strip(sentences)), 0)
            return tf.where(is_empty, tf.constant(""), text)
    else:
        def translate(self, sentences):
            raise RuntimeError(
                "Translator.translate is the TensorFlow graph a SavedModel "
                f"serves: it needs KERAS_BACKEND=tensorflow (this is "
                f"{keras.backend.backend()!r}); use translate_texts")

    def translate_texts(self, sentences, batch_size=100, progress=False):
        """Python helper: list of str -> list of str, in batches of
        ``batch_size`` (an int >= 1). An empty (or all-whitespace)
        sentence translates to "".

        Under TensorFlow with an in-graph tokenizer each batch runs
        ``translate``; otherwise the tokenizer runs on the host
        (``source_ids``) and the backend searches: on TensorFlow the graph
        of ``generate_ids`` (the ids of ``translate``), on JAX and PyTorch
        the fixed-size loop over a source padded to ``compiled_width``
        (one ``jax.jit`` compilation per 8 source lengths and batch size).

        Raises:
            TypeError: ``batch_size`` not an int (a bool included), or
                ``sentences`` a str (not a list of them).
            ValueError: ``batch_size`` < 1.
        """
        from tqdm.auto import tqdm

        batch_size = v.positive_int("batch_size", batch_size)
        if isinstance(sentences, (str, bytes)):
            raise TypeError(f"`sentences` must be a list of str, got one "
                            f"{type(sentences).__name__}: "
                            f"sentences={sentences[:50]!r}")
        sentences = list(sentences)
        out = []
        starts = range(0, len(sentences), batch_size)
        for start in tqdm(starts, disable=not progress, desc="translate",
                          unit="batch"):
            batch = sentences[start:start + batch_size]
            if _TENSORFLOW and not _on_host(self.tokenizer):
                text = self.translate(tf.constant(batch, tf.string)).numpy()
                out.extend(s.decode("utf-8") for s in text)
            else:
                out.extend(self._translate_on_host(batch))
        return out

    def _translate_on_host(self, sentences):
        """``translate`` of a list of str, the tokenizer run on the host."""
        tokens = self.source_ids(sentences)
        if _TENSORFLOW:
            if self._ids_graph is None:  # traced once, as ``translate``
                self._ids_graph = tf.function(
                    self.generate_ids,
                    input_signature=[tf.TensorSpec([None, None], tf.int32)])
            ids = self._ids_graph(tokens)
        else:
            width = int(self.compiled_width(tokens.shape[1]))
            tokens = np.pad(tokens, [(0, 0), (0, width - tokens.shape[1])],
                            constant_values=self.pad_id)
            ids = self._search(tokens, static_cache=True)
        ids = ops.convert_to_numpy(ids).astype(np.int32)
        if _on_host(self.tokenizer):
            text = self.tokenizer.detokenize(ids)
        else:  # an in-graph tokenizer under JAX or PyTorch
            import tensorflow as tf_eager

            text = [t.decode("utf-8") for t in self.tokenizer.detokenize(
                tf_eager.constant(ids, tf_eager.int32)).numpy()]
        return ["" if not s.strip(_ASCII_SPACE) else t
                for s, t in zip(sentences, text)]


class GreedyBleu:
    """``score(model) -> float``: greedy-decoding sacreBLEU on one split,
    the per-epoch validation score the translation job logs (``BleuLog``)
    and selects checkpoints by.

    Decodes a float32 twin of the training model (``float32_copy``, built
    once; the model itself when it is already float32), whose weights are
    refreshed from the scored model at each call, through one
    ``Translator`` kept across calls (traced once). A mixed_bfloat16
    model decoded as it is would cast every weight at every step: ~11 s
    per Multi30k val pass against ~3 s in float32.

    Runs on every backend; with a ``HostSentencePieceTokenizer`` it needs
    no TensorFlow (``Translator.translate_texts``).

    Args:
        model: a ``keras_trm.models.transformer()`` model (any precision).
        tokenizer: its tokenizer: ``keras_trm.text.HostSentencePieceTokenizer``
            or an in-graph one (``TextTokenizer``, ``SentencePieceTokenizer``).
        sources, references: lists of str, the validation split.

    Example:

    >>> import pathlib, tempfile
    >>> from keras_trm.models import transformer
    >>> from keras_trm.text import HostSentencePieceTokenizer, learn_sentencepiece
    >>> path = learn_sentencepiece(["a dog runs.", "ein Hund läuft."] * 20, 280,
    ...                            pathlib.Path(tempfile.mkdtemp()) / "sp.model")
    >>> tokenizer = HostSentencePieceTokenizer(path)
    >>> model = transformer(tokenizer.vocabulary_size, num_layers=1,
    ...                     d_model=8, num_heads=2, d_ff=16,
    ...                     max_sequence_length=16)
    >>> score = GreedyBleu(model, tokenizer, ["a dog runs."], ["ein Hund läuft."])
    >>> 0.0 <= score(model) <= 100.0
    True
    """

    def __init__(self, model, tokenizer, sources, references):
        self.twin = float32_copy(model)
        self.translator = Translator(self.twin, tokenizer,
                                     search=GreedySearch())
        self.sources, self.references = sources, references

    def float32_model(self, model):
        """The twin, holding ``model``'s current weights."""
        if model is not self.twin:
            self.twin.set_weights(model.get_weights())
        return self.twin

    def __call__(self, model):
        self.float32_model(model)
        hyps = self.translator.translate_texts(self.sources)
        return corpus_bleu(hyps, self.references)[0]
