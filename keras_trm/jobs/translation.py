"""The translation job: train a Transformer on any parallel corpus, in
either direction, score it with sacreBLEU, export a raw-text SavedModel and
translate a sample.

Corpora (``dataset``): Multi30k (the default, EN->DE), WMT14 EN-DE (local
Europarl slice + newstest2013/2014, or tfds online) and the user's own
parallel files (``train_source``/``train_target``, ...). Splits: train for
training; validation for everything that watches or chooses -- the greedy
BLEU after every epoch and the number of epoch checkpoints averaged; test
is decoded once, at the end, with beam search, and used for nothing else.

Long runs: ``tokens_per_step`` accumulates gradients to a paper-sized step,
checkpoints can be written every N steps or minutes, and a killed run
continues where its last backup (``workdir/backup``, every ``save_freq``
steps and every epoch) left off when the same command is run again --
delete ``workdir/backup`` to train from scratch.

Used by ``recipes/translate_multi30k.py``, ``recipes/translate_wmt14.py``
and ``keras-trm train-translation``.
"""

import dataclasses
import json
import pathlib
import re
import sys
import time
import warnings
from typing import Literal, Optional, get_args

import keras

from keras_trm.data import (
    CorpusError,
    TokenBatches,
    bucket_boundaries,
    check_parallel_corpus,
    iter_lines,
    load_translation_splits,
    parse_boundaries,
    prepare_translation_data,
    read_prepared,
    resolve_data_dir,
    sample_lines,
    translation_eval_files,
    translation_train_files,
)
from keras_trm.data.prepared import file_identity, sha256_file
from keras_trm.decoding import GreedyBleu, Translator, corpus_bleu
from keras_trm.decoding.bleu import compound_split_bleu, tokenized_bleu
from keras_trm.decoding.search import stop_rule
from keras_trm.jobs._setup import check_bool, check_folder_name
from keras_trm.jobs.stages import StagedJob
from keras_trm.utils import checks as v
from keras_trm.utils.memory import release_freed_memory
from keras_trm.models import transformer
from keras_trm.text import (
    SentencePieceTokenizer,
    TextTokenizer,
    learn_sentencepiece,
    learn_vocabulary,
    load_vocabulary,
)
from keras_trm.training import (
    EpochCheckpoints,
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    NoamSchedule,
    apply_precision,
    apply_preset,
    make_strategy,
    paper_adam,
    resolve_jit_compile,
    select_checkpoint_average,
)
from keras_trm.training import (  # long runs (issue #11)
    BleuLog,
    DataPosition,
    PerUpdateSchedule,
    TensorBoardScalars,
    TimeBudget,
    TokenCount,
    TrainingBackup,
    accumulation_steps,
    build_for_distributed_fit,
    tensorboard_writer,
    worker_info,
)
from keras_trm.utils import atomic_write, write_json
from keras_trm.utils.files import atomic_file


Dataset = Literal["multi30k", "wmt14", "wmt14_tfds", "files"]
StopRule = Literal["bound", "first_end", "never"]
Vocabulary = Literal["auto", "wordpiece", "sentencepiece_bpe",
                     "sentencepiece_unigram"]
Preset = Literal["", "cpu_small", "tiny", "transformer_base", "transformer_big"]
Strategy = Literal["default", "mirrored", "multi_worker"]
Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
OnOff = Literal["on", "off"]
OnOffAuto = Literal["auto", "on", "off"]
VOCABULARIES = get_args(Vocabulary)
DEFAULT_MODEL_NAME = "transformer_multi30k_en_de"
_LANGUAGE = re.compile(r"[A-Za-z0-9_-]+")


@dataclasses.dataclass
class TranslationConfig:
    """Corpus, vocabulary and hyper-parameters of a translation job
    (defaults: the Multi30k EN->DE CPU run the README reports).

    ``preset`` (``keras_trm.training.presets``: ``cpu_small``, ``tiny``,
    ``transformer_base``, ``transformer_big``) fills the hyper-parameters
    left at their defaults; explicit values win. ``vocabulary="auto"`` is
    a joint SentencePiece BPE (the paper's shared BPE); ``vocabulary_sample`` sentences at most are used to learn
    it.
    """

    dataset: Dataset = "multi30k"
    """Corpus: ``multi30k`` (EN-DE, in the data folder), ``wmt14`` (local
    Europarl slice + newstest2013/2014), ``wmt14_tfds`` (the full WMT14 from
    tensorflow-datasets, online) or ``files`` (``train_source`` ...)."""
    source_language: str = "en"
    """Source language code (``en`` or ``de`` for Multi30k and WMT14)."""
    target_language: str = "de"
    """Target language code (must differ from ``source_language``)."""
    train_source: str = ""
    """``dataset=files``: training source sentences, one per line (plain
    text or .gz); several corpora comma-separated (``a.en,b.en``)."""
    train_target: str = ""
    """``dataset=files``: training target sentences, line-aligned (as many
    files as ``train_source``)."""
    train_weights: str = ""
    """Sampling weights of the training corpora, comma-separated, one per
    corpus (``1,3``: a pair comes from the second corpus three times as
    often as from the first); empty: proportional to the corpora's sizes.
    ``wmt14`` has two corpora when the newstest2008-2022 pool is in the data
    folder: the Europarl slice, then the pool."""
    validation_source: str = ""
    """``dataset=files``: validation source sentences, one per line."""
    validation_target: str = ""
    """``dataset=files``: validation target sentences, line-aligned."""
    test_source: str = ""
    """``dataset=files``: test source sentences (optional: no test split
    when empty)."""
    test_target: str = ""
    """``dataset=files``: test target sentences, line-aligned."""
    vocabulary: Vocabulary = "auto"
    """Subword vocabulary: ``auto`` is a joint SentencePiece BPE (the
    paper's shared BPE; for Multi30k part of the recipe chosen on val,
    ``docs/recipes/multi30k.md``)."""
    vocabulary_sample: int = 1_000_000
    """The most training sentences the vocabulary is learned from
    (sentences)."""
    validation_limit: int = 0
    """> 0: the greedy validation BLEU of each epoch uses the first n
    pairs only (pairs; 0 = all)."""
    preset: Preset = ""
    """Hyper-parameter preset (``keras_trm.training.presets``): fills the
    fields left at their defaults; ``""`` = these defaults (``cpu_small``)."""

    vocabulary_size: int = 10000
    """Subword vocabulary size (tokens, shared by both languages); 10,000
    for Multi30k, chosen on val over 8,000 and 6,000 (trials t12, t8,
    ``docs/recipes/multi30k.md``)."""
    num_layers: int = 3
    """Encoder and decoder blocks (N)."""
    d_model: int = 256
    """Model width (units)."""
    num_heads: int = 4
    """Attention heads (h; divides d_model)."""
    d_ff: int = 1024
    """Feed-forward inner width (units)."""
    dropout_rate: float = 0.3
    """Dropout rate (fraction, 0-1); 0.3 for 29,000 Multi30k pairs, chosen
    on val (``docs/recipes/multi30k.md``)."""
    attention_dropout_rate: float = 0.0
    """Dropout on the attention probabilities (fraction, 0-1; the paper
    has none)."""
    max_sequence_length: int = 128
    """The model's positions: the longest source or target id sequence it
    takes, START/END included (tokens; ``transformer(max_sequence_length=)``,
    and the longest source the export translates)."""
    max_train_length: Optional[int] = None
    """Training pairs whose source or target ids (START/END included) are
    longer are dropped (tokens, at most ``max_sequence_length``;
    ``prepare_translation_data(max_train_length=)``); null:
    ``max_sequence_length``."""
    boundaries: str = ""
    """Bucket lengths of the token-count batches, comma-separated (tokens;
    empty: 8,12,16,20,24,32,40,48,64,96,128 below the longest training pair,
    then that length). Each bucket is one batch shape: under JAX one
    ``jax.jit`` compilation each, so fewer buckets compile faster and pad
    more."""
    max_length: Optional[int] = None
    """Deprecated: ``max_sequence_length`` and ``max_train_length`` in one
    (the single setting they replace); it sets both: ``max_sequence_length``
    to it, ``max_train_length`` to null (the same value) (tokens)."""
    label_smoothing: float = 0.2
    """Label smoothing (epsilon_ls, fraction); 0.2 for 29,000 Multi30k
    pairs, chosen on val over the paper's 0.1 (trial t10,
    ``docs/recipes/multi30k.md``)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW, Loshchilov & Hutter 2019; fraction of
    the learning rate per update, ``paper_adam(weight_decay=)``): weight
    matrices and embeddings shrink by lr * weight_decay of themselves
    before each update; biases and LayerNorm are exempt. 0: none, as in
    the paper; 0.1 was tried on Multi30k's val and not adopted (trial
    t13, ``docs/recipes/multi30k.md``)."""
    warmup_steps: int = 800
    """Noam schedule warm-up (updates)."""
    lr_scale: float = 0.6
    """Factor on the Noam learning rate d_model^-0.5 * min(...)."""
    tokens_per_batch: int = 2048
    """Batch size in padded tokens per side (tokens)."""
    epochs: int = 30
    """The most training epochs (the time budget may stop earlier)."""
    time_budget_minutes: float = 45.0
    """Training time budget (minutes): stops after the epoch that another
    epoch would overrun (30 Multi30k epochs take about 34 min on a 2-core
    AVX512_BF16 host)."""
    average_last: int = 5
    """The most epoch checkpoints averaged (the number chosen by
    validation BLEU)."""
    beam_size: int = 5
    """Beam width of the final test decoding (beams)."""
    length_penalty: float = 1.2
    """Beam search length penalty (GNMT alpha); on Multi30k val, beam 5
    was the best of {4, 5} x {0.6, 1.0}, then 1.2 the best alpha of
    {0.6, 0.8, 1.0, 1.2, 1.4} for three trained recipes, and beams 8 and
    10 no better (``docs/results/multi30k_sweep.json``)."""
    early_stopping: StopRule = "bound"
    """When beam search stops a sentence (test decoding and the export):
    ``bound`` (exact: no live hypothesis can still win), ``first_end``
    (CTranslate2's early exit: when the best candidate ends; faster, may
    differ with alpha > 0) or ``never`` (at the token limit)."""
    parallel_searches: int = 1
    """Searches each batch is dealt into and run at once (test decoding and
    the export; ``Translator``): 2 with 2 inter-op threads decoded
    batches of 100 at beam 4 1.6x faster on 2 cores at intra-op 1, with
    the same outputs; behind a loaded server (concurrent requests already
    use the cores) 2 was slower (0.80x with batching), so 1 suits serving
    (docs/serving.md)."""
    export_jit_compile_max_batch_size: int = 0
    """0: the export runs the graph search at every batch size. n >= 1:
    requests of at most n sentences run the search compiled whole by XLA
    (``Translator(jit_compile=True, jit_compile_max_batch_size=n)``, the
    same ids): one sentence decoded in about half the graph search's time
    on 2 cores, after a compilation (~2 s) per batch size and 8 source
    lengths. The export's warm-up requests make the server compile those
    at load for every length the validation set has (n x buckets
    compilations); larger requests keep the graph search. It pays with
    intra-op threads > 1 (XLA runs on that pool; docs/serving.md). TF
    Serving needs ``--xla_cpu_compilation_enabled=true`` for it
    (sentences)."""
    eval_every_epochs: int = 1
    """Greedy validation BLEU every n epochs (epochs)."""
    strategy: Strategy = "default"
    """Distribution: ``default`` (one device), ``mirrored`` (local GPUs, or
    2 logical CPU devices), ``multi_worker`` (cluster from TF_CONFIG)."""
    jit_compile: OnOffAuto = "off"
    """XLA for the training step: ``on``, ``off`` or ``auto`` (off for
    several CPU replicas, on otherwise). Under ``KERAS_BACKEND=jax`` the
    step is always compiled (``jax.jit``)."""
    precision: Precision = "auto"
    """Dtype policy: ``auto`` picks mixed_bfloat16 only on CPUs where it was
    measured faster (native bfloat16, under TensorFlow), else float32."""
    seed: int = 0
    """Random seed (data order, initialization, vocabulary sample)."""
    limit: int = 0
    """> 0: only the first n pairs of each split, for smoke runs (pairs;
    0 = all)."""
    model_name: str = DEFAULT_MODEL_NAME
    """Export folder name under export_dir (the default becomes
    transformer_<dataset>_<src>_<tgt> off Multi30k EN->DE)."""
    # Long runs (issue #11): gradient accumulation, checkpoints, resume, logs.
    tokens_per_step: int = 0
    """> 0: accumulate micro-batches up to this many tokens per update
    (tokens; 0 = one batch per update)."""
    checkpoint_every_steps: int = 0
    """Also write a checkpoint every n updates (steps; 0 with
    checkpoint_every_minutes 0 = one per epoch)."""
    checkpoint_every_minutes: float = 0.0
    """Also write a checkpoint every m minutes of training (minutes; the
    paper used 10)."""
    save_freq: int = 100
    """Training steps between resume backups in workdir/backup (steps)."""
    tensorboard: OnOff = "on"
    """Write training scalars to workdir/tensorboard."""
    tensorboard_every_steps: int = 50
    """Steps between TensorBoard scalar writes (steps)."""
    download: bool = True
    """Fetch data missing from the data folder (online)."""
    max_file_mib: float = 64.0
    """The largest file of the prepared token ids in workdir/prepared
    (MiB; ``keras_trm.data.prepare_translation_data``): a folder of such
    files moves easily between machines."""

    # The sections of the command line and YAML (``--model.d_model``,
    # ``model: {d_model: ...}``; ``keras_trm.cli.config_keys``); the flat
    # ``--d_model`` of before works too. The others (preset, seed, the
    # deprecated max_length) stay at the top.
    SECTIONS = {
        "data": ("dataset", "source_language", "target_language",
                 "train_source", "train_target", "train_weights",
                 "validation_source", "validation_target", "test_source",
                 "test_target", "vocabulary", "vocabulary_size",
                 "vocabulary_sample", "max_train_length", "boundaries", "limit",
                 "download", "max_file_mib"),
        "model": ("num_layers", "d_model", "num_heads", "d_ff", "dropout_rate",
                  "attention_dropout_rate", "max_sequence_length"),
        "training": ("label_smoothing", "weight_decay", "warmup_steps", "lr_scale",
                     "tokens_per_batch", "tokens_per_step", "epochs",
                     "time_budget_minutes", "average_last", "eval_every_epochs",
                     "validation_limit", "strategy", "jit_compile", "precision",
                     "checkpoint_every_steps", "checkpoint_every_minutes",
                     "save_freq", "tensorboard", "tensorboard_every_steps"),
        "decoding": ("beam_size", "length_penalty", "early_stopping",
                     "parallel_searches"),
        "export": ("model_name", "export_jit_compile_max_batch_size"),
    }

    # Old field -> the fields it now sets (``keras_trm.cli.parse_config``
    # says so on the command line and records the new ones).
    RENAMED_FIELDS = {"max_length": ("max_sequence_length", "max_train_length")}

    def __post_init__(self):
        if self.max_length is not None:  # the old single length: sets both
            warnings.warn(
                "`max_length` is now `max_sequence_length` (the model's "
                "positions) and `max_train_length` (the longest training "
                "pair kept); the old name sets both and will go",
                DeprecationWarning, stacklevel=v.caller_stacklevel())
            # The training filter follows the positions (None), as the one
            # length did, also when a preset then sets the positions.
            self.max_sequence_length = self.max_length
            self.max_train_length = None
            self.max_length = None

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value (``keras-trm train-translation`` turns it into a usage error,
        exit 2, before anything is written; ``run`` checks too): among
        others a setting that is not one of its choices (``jit_compile``,
        ``tensorboard``: the strings ``on``/``off``/``auto``), a
        ``download`` that is not a bool, equal source and target
        languages, a ``model_name`` that is not a plain folder name, an
        infinite ``length_penalty`` or ``checkpoint_every_minutes``, and
        ``train_weights`` that are not comma-separated numbers >= 0."""
        for name in ("vocabulary_size", "num_layers", "d_model", "num_heads",
                     "d_ff", "max_sequence_length", "warmup_steps", "tokens_per_batch",
                     "epochs", "average_last", "beam_size", "parallel_searches",
                     "eval_every_epochs", "save_freq", "tensorboard_every_steps"):
            v.positive_int(name, getattr(self, name))
        for name in ("seed", "limit", "tokens_per_step", "checkpoint_every_steps",
                     "validation_limit", "export_jit_compile_max_batch_size"):
            v.non_negative_int(name, getattr(self, name))
        v.divisible("d_model", self.d_model, "num_heads", self.num_heads)
        if self.max_train_length is not None:
            v.positive_int("max_train_length", self.max_train_length)
            if self.max_train_length > self.max_sequence_length:
                raise ValueError(
                    "`max_train_length` must be at most `max_sequence_length` "
                    f"(the model's positions), got max_train_length="
                    f"{self.max_train_length} and max_sequence_length="
                    f"{self.max_sequence_length}")
        if train_length(self) < 2:  # START or END and one token
            raise ValueError(
                "`max_train_length` (default: `max_sequence_length`) must be "
                f">= 2, got {train_length(self)}")
        if self.tokens_per_batch < train_length(self):
            # The last length bucket is train_length: one such pair must fit.
            raise ValueError(
                "`tokens_per_batch` must be at least the longest training pair "
                "(`max_train_length`, default `max_sequence_length`: "
                f"{train_length(self)} tokens), got tokens_per_batch="
                f"{self.tokens_per_batch}")
        v.rate("dropout_rate", self.dropout_rate)
        v.rate("attention_dropout_rate", self.attention_dropout_rate)
        v.rate("label_smoothing", self.label_smoothing)
        v.non_negative_float("weight_decay", self.weight_decay)
        v.positive_float("time_budget_minutes", self.time_budget_minutes)
        v.positive_float("lr_scale", self.lr_scale)
        v.non_negative_float("length_penalty", self.length_penalty)
        v.non_negative_float("checkpoint_every_minutes", self.checkpoint_every_minutes)
        v.positive_float("max_file_mib", self.max_file_mib)
        stop_rule(self.early_stopping)
        parse_boundaries(self.boundaries)
        v.one_of("dataset", self.dataset, get_args(Dataset))
        v.one_of("jit_compile", self.jit_compile, get_args(OnOffAuto))
        v.one_of("tensorboard", self.tensorboard, get_args(OnOff))
        check_bool("download", self.download)
        for name in ("source_language", "target_language"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _LANGUAGE.fullmatch(value):
                raise ValueError(f"`{name}` must be a language code such as 'en' "
                                 "(letters, digits, '-' or '_'; it names files "
                                 f"and the export folder), got {name}={value!r}")
        if self.source_language == self.target_language:
            raise ValueError(
                "`source_language` and `target_language` must differ, got "
                f"source_language={self.source_language!r} and "
                f"target_language={self.target_language!r}")
        check_folder_name("model_name", self.model_name)
        _parse_weights(self.train_weights)


def train_length(config):
    """The longest training pair a config keeps (tokens, START/END
    included): ``max_train_length``, or ``max_sequence_length`` where it is
    None."""
    if config.max_train_length is None:
        return config.max_sequence_length
    return config.max_train_length


def vocabulary_kind(config):
    """The vocabulary a config asks for (``"auto"`` resolved)."""
    if config.vocabulary not in VOCABULARIES:
        raise ValueError(f"`vocabulary` must be one of {VOCABULARIES}, got "
                         f"vocabulary={config.vocabulary!r}")
    if config.vocabulary == "auto":
        return "sentencepiece_bpe"
    return config.vocabulary


def prepare_tokenizer(config, corpora, workdir):
    """A joint source+target tokenizer: WordPiece (``TextTokenizer``) or
    SentencePiece (``SentencePieceTokenizer``), learned once from at most
    ``config.vocabulary_sample`` training sentences (a seeded sample of the
    source files, then the target files, of ``corpora``: ``(name,
    source_path, target_path)`` tuples) and cached in ``workdir``."""
    kind = vocabulary_kind(config)
    if kind == "wordpiece":
        return TextTokenizer(prepare_vocabulary(config, corpora, workdir))
    model_type = kind.split("_", 1)[1]
    path = pathlib.Path(workdir) / f"spm_{model_type}_{config.vocabulary_size}.model"
    if not path.is_file():
        print(f"learning a joint SentencePiece {model_type} vocabulary "
              f"({config.vocabulary_size}) from at most {config.vocabulary_sample:,} "
              "sentences ...", flush=True)
        learn_sentencepiece(_vocabulary_sample(config, corpora), config.vocabulary_size,
                            path, model_type=model_type,
                            sample_size=config.vocabulary_sample, seed=config.seed)
    return SentencePieceTokenizer(path)


def _vocabulary_sample(config, corpora):
    paths = [c[1] for c in corpora] + [c[2] for c in corpora]
    return sample_lines(paths, config.vocabulary_sample, seed=config.seed)


def _model_name(config):
    if config.model_name != DEFAULT_MODEL_NAME or (
            config.dataset, config.source_language,
            config.target_language) == ("multi30k", "en", "de"):
        return config.model_name
    dataset = config.dataset.replace("_tfds", "")
    return f"transformer_{dataset}_{config.source_language}_{config.target_language}"


def prepare_vocabulary(config, corpora, workdir):
    path = pathlib.Path(workdir) / f"vocab_{config.vocabulary_size}.txt"
    if path.is_file():
        return load_vocabulary(path)
    print(f"learning a joint WordPiece vocabulary ({config.vocabulary_size}) ...",
          flush=True)
    return learn_vocabulary(_vocabulary_sample(config, corpora),
                            config.vocabulary_size, path)


# learn_sentencepiece's defaults: the characters a SentencePiece vocabulary
# must hold cover this share of the text; byte_fallback adds 256 pieces.
SENTENCEPIECE_COVERAGE = 0.9999
SENTENCEPIECE_BYTE_PIECES = 256
WORDPIECE_MAX_CHARACTERS = 1000  # the WordPiece learner's alphabet cap


def minimum_vocabulary_size(kind, characters):
    """The smallest ``vocabulary_size`` a vocabulary learned from text with
    these characters can have without losing any of them.

    ``wordpiece``: the 4 reserved tokens plus each character twice, as a
    word and as a ``##`` continuation (whitespace and invisible control or
    format characters excepted: the learner splits on them; at most 1000
    characters, its alphabet's cap). With fewer the learner's list is cut
    short (keras-hub keeps its first ``vocabulary_size`` tokens, the
    ``##`` characters last), so words with the missing characters become
    ``[UNK]``. A necessary bound only: a learner that overshoots a size
    above it is cut short too.

    ``sentencepiece_bpe`` / ``sentencepiece_unigram``: 4 special pieces +
    256 byte pieces + the characters that cover 99.99% of the text after
    SentencePiece's ``nmt_nfkc`` normalization (whitespace as one piece,
    "▁"); the learner raises below that.

    Args:
        kind: ``"wordpiece"``, ``"sentencepiece_bpe"`` or
            ``"sentencepiece_unigram"`` (``vocabulary_kind``).
        characters: mapping character -> occurrences in the training text
            (``check_parallel_corpus(...)["characters"]``, summed over the
            corpora, source and target together).

    Returns:
        ``(minimum, n)``: the size (tokens) and the number of characters
        it holds.

    Example:
        >>> import collections
        >>> text = collections.Counter("Ein Hund. Zwei Hunde.")
        >>> minimum_vocabulary_size("wordpiece", text)
        (24, 10)
        >>> minimum_vocabulary_size("sentencepiece_bpe", text)
        (271, 11)
    """
    import unicodedata

    if kind == "wordpiece":
        n = sum(1 for c in characters if c != " "
                and unicodedata.category(c) not in ("Cc", "Cf"))
        n = min(n, WORDPIECE_MAX_CHARACTERS)
        return 4 + 2 * n, n
    if not kind.startswith("sentencepiece_"):
        raise ValueError(f"`kind` must be one of {VOCABULARIES[1:]}, got kind={kind!r}")
    normalize = _sentencepiece_normalizer()
    counts = {}
    for c, times in characters.items():
        for piece in normalize(c):
            counts[piece] = counts.get(piece, 0) + times
    total, covered, n = sum(counts.values()), 0, 0
    for times in sorted(counts.values(), reverse=True):
        if covered >= SENTENCEPIECE_COVERAGE * total:
            break
        covered += times
        n += 1
    return 4 + SENTENCEPIECE_BYTE_PIECES + n, n


def _sentencepiece_normalizer():
    """One character -> the pieces SentencePiece's ``nmt_nfkc`` turns it
    into ("" for dropped ones, "▁" for whitespace)."""
    try:
        import sentencepiece as spm

        rule = spm.SentencePieceNormalizer(rule_name="nmt_nfkc")
        return lambda c: rule.normalize("x" + c + "y")[2:-1]
    except (ImportError, AttributeError):  # sentencepiece < 0.2: NFKC
        import unicodedata

        return lambda c: ("▁" if c.isspace() else
                          unicodedata.normalize("NFKC", c))


def check_inputs(config, data_dir=None):
    """Checks the corpora a translation job reads, and what they rule out,
    before it writes anything; ``run`` calls it first.

    Every training corpus is read once, streaming
    (``keras_trm.data.check_parallel_corpus``: UTF-8, equal line counts,
    text), then every validation and test pair of files
    (``keras_trm.data.translation_eval_files``: Multi30k's val and
    test_2016_flickr, WMT14's newstest2013/2014, or the ``files``
    dataset's own); then
    ``config.vocabulary_size`` must hold the training text's characters
    (``minimum_vocabulary_size``; with ``limit``, those of the first
    ``limit`` lines, what the vocabulary is learned from). Multi30k's files
    are fetched first when missing and ``config.download`` (as ``run``
    does); ``wmt14_tfds`` is read from tfds, so nothing is checked.

    Args:
        config: ``TranslationConfig`` (its ``preset`` is applied).
        data_dir: data folder for ``multi30k`` / ``wmt14`` (see
            ``keras_trm.data.resolve_data_dir``).

    Returns:
        dict: ``corpora`` (name -> ``check_parallel_corpus`` result, its
        ``characters`` left out) and ``minimum_vocabulary_size`` (tokens;
        None for ``wmt14_tfds``).

    Raises:
        CorpusError: (a ``ValueError``) a bad file (the message names it and
            the value: both line counts, the line and byte of invalid
            UTF-8, ...), missing ``--validation-source/target`` files, or a
            ``vocabulary_size`` below the minimum (the message names both),
            or a missing file or data folder (the message names the files
            expected and where).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for name, text in (("t.en", "A dog.\\n"), ("t.de", "Ein Hund.\\n")):
        ...     _ = (d / name).write_text(text)
        >>> config = TranslationConfig(
        ...     dataset="files", train_source=str(d / "t.en"),
        ...     train_target=str(d / "t.de"), validation_source=str(d / "t.en"),
        ...     validation_target=str(d / "t.de"), vocabulary_size=100)
        >>> check_inputs(config)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        keras_trm.data.translation.CorpusError: `vocabulary_size` (--vocabulary_size) must be at least 271 for a sentencepiece_bpe ...; got vocabulary_size=100
        >>> check_inputs(dataclasses.replace(config, vocabulary_size=300))
        {'corpora': {'t': {'lines': 1, 'pairs': 1}}, 'minimum_vocabulary_size': 271}
    """
    config = apply_preset(config)
    kind = vocabulary_kind(config)
    if config.dataset == "wmt14_tfds":
        return {"corpora": {}, "minimum_vocabulary_size": None}
    files = {name: getattr(config, name) for name in (
        "train_source", "train_target", "validation_source",
        "validation_target", "test_source", "test_target")}
    where = dict(source_language=config.source_language,
                 target_language=config.target_language, files=files,
                 download=config.download)
    try:
        if config.dataset != "files":
            data_dir = resolve_data_dir(data_dir, must_exist=not config.download)
        else:
            data_dir = None
        corpora = translation_train_files(config.dataset, data_dir, **where)
        evaluation = translation_eval_files(config.dataset, data_dir, **where)
    except FileNotFoundError as err:  # a usage error: names the files expected
        raise CorpusError(str(err)) from None
    except ValueError as err:  # the flags name too few files
        raise CorpusError(str(err)) from None
    reports, characters = {}, {}
    for name, source_path, target_path in corpora:
        report = check_parallel_corpus(source_path, target_path,
                                       character_lines=config.limit)
        for c, times in report.pop("characters").items():
            characters[c] = characters.get(c, 0) + times
        reports[name] = report
    for _, _, source_path, target_path in evaluation:
        check_parallel_corpus(source_path, target_path, characters=False)
    minimum, n = minimum_vocabulary_size(kind, characters)
    if config.vocabulary_size < minimum:
        what = ("4 reserved tokens + 2 x {n} distinct characters, each as a "
                "word and as a ##continuation" if kind == "wordpiece" else
                "4 special + 256 byte pieces + the {n} characters covering "
                "99.99% of the text")
        names = ", ".join(repr(c[0]) for c in corpora)
        raise CorpusError(
            f"`vocabulary_size` (--vocabulary_size) must be at least {minimum} "
            f"for a {kind} vocabulary of the training "
            f"{'corpora' if len(corpora) > 1 else 'corpus'} {names}"
            f"{f' (first {config.limit} lines)' if config.limit else ''}: "
            f"{what.format(n=n)}; got vocabulary_size={config.vocabulary_size}")
    return {"corpora": reports, "minimum_vocabulary_size": minimum}


def _tfds_train_files(workdir, source_language, target_language):
    """tfds ``wmt14_translate/de-en`` train written once, streaming, to
    ``workdir/wmt14_train.{src,tgt}.gz`` (what the token ids are prepared from)."""
    import gzip

    import tensorflow_datasets as tfds

    paths = [pathlib.Path(workdir) / f"wmt14_train.{lang}.gz"
             for lang in (source_language, target_language)]
    if not all(p.is_file() for p in paths):
        ds = tfds.load("wmt14_translate/de-en", split="train")
        with atomic_file(paths[0]) as tmp_src, atomic_file(paths[1]) as tmp_tgt:
            with gzip.open(tmp_src, "wt", encoding="utf-8") as fs, \
                    gzip.open(tmp_tgt, "wt", encoding="utf-8") as ft:
                for ex in tfds.as_numpy(ds):
                    fs.write(ex[source_language].decode("utf-8").replace("\n", " ") + "\n")
                    ft.write(ex[target_language].decode("utf-8").replace("\n", " ") + "\n")
    return [("wmt14_train", *paths)]


def _parse_weights(text):
    """``train_weights`` as a list of floats (None when empty).

    Raises:
        TypeError: not a str.
        ValueError: not comma-separated finite numbers >= 0 with a
            positive sum (the value named).
    """
    if not isinstance(text, str):
        raise TypeError(f"`train_weights` must be a str of comma-separated numbers, "
                        f"got train_weights={text!r}")
    if not text.strip():
        return None
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        weights = []
    if (not weights or not all(0 <= w < float("inf") for w in weights)
            or sum(weights) <= 0):
        raise ValueError(
            "`train_weights` must be comma-separated finite numbers >= 0 with a "
            f"positive sum, one per training corpus, got train_weights={text!r}")
    return weights


def _weights(config, corpora):
    weights = _parse_weights(config.train_weights)
    if weights is None:
        return None
    if len(weights) != len(corpora):
        raise ValueError(
            f"`train_weights` must give one number >= 0 per training corpus "
            f"({len(corpora)}: {', '.join(c[0] for c in corpora)}) with a positive sum, "
            f"got train_weights={config.train_weights!r}")
    return weights


def token_encoder(tokenizer):
    """``encode(lines) -> list of int32 id arrays`` (content ids, no
    START/END) for ``prepare_translation_data``: the tokenizer's own
    host ``encode`` where it has one (SentencePiece through the
    ``sentencepiece`` package, no TensorFlow), else its in-graph
    ``tokenize`` (WordPiece, TensorFlow)."""
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return encode

    def encode_in_graph(lines):
        import tensorflow as tf

        ragged = tokenizer.tokenize(tf.constant(lines))
        return [row.astype("int32") for row in ragged.numpy()]

    return encode_in_graph


def vocabulary_sha256(tokenizer):
    """SHA-256 of what defines a tokenizer's ids: a SentencePiece model's
    bytes, else its vocabulary one token a line. Part of the prepared
    folder's key: ids of another vocabulary are prepared again.

    Example:

    >>> class Tok:
    ...     vocabulary = ["[PAD]", "[UNK]", "[START]", "[END]", "a"]
    >>> vocabulary_sha256(Tok())[:12]
    '220285505c53'
    """
    import hashlib

    proto = getattr(tokenizer, "model_proto", None)
    if proto is not None:
        return hashlib.sha256(bytes(proto)).hexdigest()
    text = "\n".join(tokenizer.vocabulary) + "\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare_training_batches(config, corpora, tokenizer, folder, boundaries,
                             position, num_processes=1, process_index=0):
    """Prepares the training corpora's token ids once
    (``keras_trm.data.prepare_translation_data``: reused while its key --
    corpus files, vocabulary, filters -- matches) and returns the
    training batches over them.

    Returns:
        dict: ``batches`` (an endless ``keras_trm.data.TokenBatches``,
        resuming from ``position``), ``steps_per_epoch``, ``manifest``
        (with ``reused``), ``weights`` (None: one corpus, every pair once
        an epoch).
    """
    weights = _weights(config, corpora)
    vocabulary = len(tokenizer.vocabulary)
    manifest = prepare_translation_data(
        folder, corpora, token_encoder(tokenizer), vocabulary,
        vocabulary_sha256(tokenizer), max_train_length=train_length(config),
        max_file_mib=config.max_file_mib)
    # Checked as any folder is (sizes, SHA-256, ids within the vocabulary);
    # a folder that was just written is only opened.
    prepared = read_prepared(folder, vocabulary_size=vocabulary,
                             key=manifest["key"], verify=manifest["reused"],
                             check_ids=manifest["reused"])
    splits = [prepared.splits[name] for name, _, _ in corpora]
    if weights is None and len(splits) > 1:  # each pair equally likely
        weights = [len(s) for s in splits]
    batches = TokenBatches(
        splits, config.tokens_per_batch, boundaries, weights=weights,
        seed=config.seed, repeat=True, process_index=process_index,
        num_processes=num_processes, position=position)
    return {"batches": batches, "steps_per_epoch": batches.batches_per_epoch,
            "manifest": manifest, "weights": weights}


def first_lines(corpora, n, workdir, languages=None):
    """The first ``n`` lines of each corpus (smoke runs, ``limit``),
    written to ``workdir/limit_<n>/``; returns the corpora as
    ``(name, source_path, target_path)`` tuples over those copies.

    Each copy is named by its corpus and language
    (``<name>.<language>.gz``; ``languages``: the ``(source, target)``
    codes, default ``("source", "target")``) and keyed to the file it was
    copied from (path, size, modification time, in ``<copy>.key.json``):
    it is reused only while that key holds, and written again when the
    direction, the data folder or the file changed -- never a copy of
    other text.
    """
    import gzip
    import itertools

    if languages is None:
        languages = ("source", "target")
    folder = pathlib.Path(workdir) / f"limit_{n}"
    out = []
    for name, *paths in corpora:
        copies = []
        for language, path in zip(languages, paths):
            copy = folder / f"{name}.{language}.gz"
            key_path = folder / f"{name}.{language}.gz.key.json"
            key = {"source": file_identity(path), "lines": int(n)}
            try:
                current = json.loads(key_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                current = None
            if current != key or not copy.is_file():
                key_path.unlink(missing_ok=True)  # no stale key over a new copy
                with atomic_file(copy) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as f:
                    for line in itertools.islice(iter_lines(path), n):
                        f.write(line + "\n")
                write_json(key_path, key)
            copies.append(copy)
        out.append((name, *copies))
    return out


# The settings that make a run what it is: a backup written under other
# values is refused, not resumed (the epochs, the time budget, evaluation,
# checkpointing, export and the strategy may change when a run resumes).
FINGERPRINT_FIELDS = (
    "dataset", "source_language", "target_language", "train_source",
    "train_target", "train_weights", "vocabulary", "vocabulary_size", "limit",
    "num_layers", "d_model", "num_heads", "d_ff", "dropout_rate",
    "attention_dropout_rate", "max_sequence_length", "max_train_length",
    "label_smoothing", "weight_decay", "warmup_steps", "lr_scale",
    "tokens_per_batch", "tokens_per_step", "precision", "seed")


def run_fingerprint(config):
    """``FINGERPRINT_FIELDS`` of ``config``: what ``TrainingBackup``
    compares before it resumes a run from a backup.

    Example:

    >>> run_fingerprint(TranslationConfig())["target_language"]
    'de'
    """
    return {name: getattr(config, name) for name in FINGERPRINT_FIELDS}


@dataclasses.dataclass
class TranslationData:
    """What ``resolve_translation_data`` found: the data folder (None for
    ``dataset="files"``), the split names (``{"validation": ..., "test":
    ...}``), the training corpora as ``(name, source_path, target_path)``
    (files, streamed later) and the val and test pairs as
    ``(sources, targets)`` lists of strings (a few thousand lines)."""

    data_dir: Optional[pathlib.Path]
    names: dict
    corpora: list
    validation: tuple
    test: tuple


def resolve_translation_data(config, data_dir, workdir):
    """The corpora a translation config names, as the job and
    ``keras-trm prepare-translation`` both read them: the data folder
    resolved (``keras_trm.data.resolve_data_dir``), val and test loaded,
    the training corpora located (tfds' WMT14 written once to
    ``workdir``), and ``limit`` / ``validation_limit`` applied (``limit``
    also copies the first lines of each training corpus to ``workdir``).

    Args:
        config: a validated ``TranslationConfig``.
        data_dir: the ``--data_dir`` flag (None: the default folder).
        workdir: the run folder (``pathlib.Path``).

    Returns:
        ``TranslationData``.

    Raises:
        FileNotFoundError / CorpusError: as ``load_translation_splits``
            and ``translation_train_files`` (``check_inputs`` reports
            them earlier, with the flag to fix).
    """
    data_dir = (None if config.dataset == "files"
                else resolve_data_dir(data_dir, must_exist=not config.download))
    files = {name: getattr(config, name) for name in (
        "train_source", "train_target", "validation_source",
        "validation_target", "test_source", "test_target")}
    languages = (config.source_language, config.target_language)
    splits = load_translation_splits(config.dataset, data_dir, *languages, files=files,
                                     download=config.download, include_train=False)
    if config.dataset == "wmt14_tfds":
        corpora = _tfds_train_files(workdir, *languages)
    else:
        corpora = translation_train_files(config.dataset, data_dir, *languages,
                                          files=files, download=config.download)
    (val_src, val_tgt), (test_src, test_tgt) = splits.validation, splits.test
    if config.limit:  # the vocabulary too is learned from the first n pairs
        n = config.limit
        val_src, val_tgt, test_src, test_tgt = (
            x[:n] for x in (val_src, val_tgt, test_src, test_tgt))
        corpora = first_lines(corpora, n, workdir, languages)
    if config.validation_limit:
        val_src = val_src[:config.validation_limit]
        val_tgt = val_tgt[:config.validation_limit]
    return TranslationData(data_dir, dict(splits.names), corpora,
                           (val_src, val_tgt), (test_src, test_tgt))


class _OneDevice:
    """The job's strategy off TensorFlow: one process, Keras' own device
    placement (``tf.distribute`` is TensorFlow's)."""

    num_replicas_in_sync = 1

    def scope(self):
        import contextlib

        return contextlib.nullcontext()


def job_strategy(kind):
    """``make_strategy(kind)`` on TensorFlow; on JAX and PyTorch only
    ``"default"`` (one process, Keras' device placement).

    Raises:
        ValueError: ``mirrored`` / ``multi_worker`` off TensorFlow.
    """
    if keras.backend.backend() == "tensorflow":
        return make_strategy(kind)
    if kind != "default":
        raise ValueError(f"`strategy`={kind!r} is TensorFlow's tf.distribute; under "
                         f"KERAS_BACKEND={keras.backend.backend()} use 'default'")
    return _OneDevice()


def tf_dataset(batches):
    """``batches`` (``TokenBatches``) as the ``tf.data.Dataset`` that
    TensorFlow's ``fit`` and ``tf.distribute`` take: a thin
    ``from_generator`` whose shapes are ``(None, None)``. (Keras' own
    PyDataset adapter fixes each dimension its first two batches agree on,
    so a later bucket's width would be refused.)"""
    import itertools
    import weakref

    import tensorflow as tf

    # TensorFlow keeps a from_generator's generator state past the dataset
    # (a C++ registry), which kept the batches (their plan, the mapped
    # chunks) alive after training: the generator holds them weakly, the
    # returned dataset strongly, so they go with the dataset.
    held = weakref.ref(batches)

    def generate():
        for i in itertools.count():
            if held() is None:
                return
            yield held()[i]

    spec = tf.TensorSpec((None, None), tf.int32)
    dataset = tf.data.Dataset.from_generator(
        generate,
        output_signature=({"encoder_tokens": spec, "decoder_tokens": spec}, spec))
    options = tf.data.Options()
    # Each worker already reads its own share: no tf.distribute re-sharding.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    dataset = dataset.prefetch(2).with_options(options)
    dataset.token_batches = batches
    return dataset


def run(config=None, data_dir=None, workdir="runs/multi30k",
        export_dir="export", samples=()):
    """Runs the whole job; returns a dict of the figures it measured.

    The job sets Keras' global dtype policy from ``config.precision`` and
    puts the previous one back when it ends (also on an error).

    A full disk loses nothing (every file is written under a temporary
    name and renamed into place; see ``keras_trm.utils.files``):

    - ``workdir`` full during training: the backup or checkpoint write
      raises ``OSError`` (``errno.ENOSPC``, naming the file and the space
      needed and free); the previous backup stays complete, so the same
      command run again once there is space resumes from it.
    - the export fails (e.g. ``export_dir`` full): ``result.json`` is still
      written, with ``"export": null`` and ``"export_error"`` (the
      message), then the export's error is raised (so a script sees a
      failed run). The same command run again trains no further (its
      backup is finished) and decodes and exports again.
    """
    previous_policy = keras.config.dtype_policy()
    try:
        return _run(config, data_dir, workdir, export_dir, samples)
    finally:
        keras.config.set_dtype_policy(previous_policy)


def _search_options(config):
    """The ``Translator`` search arguments of a job's config."""
    return dict(beam_size=config.beam_size,
                length_penalty=config.length_penalty,
                early_stopping=config.early_stopping,
                parallel_searches=config.parallel_searches)


def export_translation(translator, config, export_dir, warmup_sources=()):
    """Writes ``translator`` (a float32 model and its tokenizer) as the job's
    raw-text SavedModel, ``<export_dir>/<config.model_name>/<version>/``,
    with ``vocab.txt`` and ``config.json`` in its assets; with
    ``config.export_jit_compile_max_batch_size`` its search is the XLA one
    for small batches and the SavedModel carries warm-up requests built from
    ``warmup_sources`` (str, e.g. the val sources). TensorFlow backend only
    (the SavedModel is a TensorFlow graph); ``export_translation_in_tensorflow``
    does it from the other backends.

    Returns:
        ``pathlib.Path`` of the version folder.

    Raises:
        OSError: ``errno.ENOSPC`` when ``export_dir`` is full (nothing of
            the version is left, see ``export_module``).
    """
    from keras_trm.export.saved_model import export_module
    from keras_trm.export.warmup import translator_warmup_requests

    exported, warmup = translator, None
    if config.export_jit_compile_max_batch_size:
        exported = Translator(
            translator.model, translator.tokenizer, **_search_options(config),
            jit_compile=True,
            jit_compile_max_batch_size=config.export_jit_compile_max_batch_size)
        # Replayed at load by the server: XLA compiles then, not on the
        # first request of each batch size and source length.
        warmup = translator_warmup_requests(exported, warmup_sources)
    return export_module(
        exported, export_dir, config.model_name,
        signatures={"serving_default": exported.translate},
        assets={"vocab.txt": "\n".join(translator.tokenizer.vocabulary) + "\n",
                "config.json": json.dumps(dataclasses.asdict(config), indent=1)},
        warmup_requests=warmup,
    )


def export_request(model_path, config, workdir, export_dir, warmup_sources=()):
    """Writes ``<workdir>/export_request.json``: what the SavedModel export
    of a model trained under JAX or PyTorch needs (the ``.keras`` file,
    the config, the workdir with its vocabulary, the export folder, the
    warm-up sources). Returns the command that runs it on a machine with
    TensorFlow (``keras-trm export-translation --workdir WORKDIR``)."""
    workdir = pathlib.Path(workdir)
    path = write_json(workdir / "export_request.json", {
        "model": str(pathlib.Path(model_path).resolve()),
        "workdir": str(workdir.resolve()),
        "export_dir": str(pathlib.Path(export_dir).resolve()),
        "config": dataclasses.asdict(config),
        "warmup_sources": list(warmup_sources)})
    return f"keras-trm export-translation --workdir {workdir}"


def tensorflow_installed():
    """Whether ``import tensorflow`` can find it (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


def export_translation_in_tensorflow(command, timeout=3600):
    """Runs an ``export_request`` command in a child process (the
    SavedModel is a TensorFlow graph; the model was trained under JAX or
    PyTorch): the same weights and the same search, so the SavedModel
    translates as the in-process search does.

    Returns:
        ``pathlib.Path`` of the version folder.

    Raises:
        RuntimeError: the child failed (its last output lines in the
            message).
    """
    import os
    import shlex
    import subprocess

    workdir = shlex.split(command)[-1]
    request = pathlib.Path(workdir) / "export_request.json"
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    child = subprocess.run(
        [sys.executable, "-m", "keras_trm.cli", "export-translation", "--workdir",
         workdir],
        env=env, capture_output=True, text=True, timeout=timeout)
    if child.returncode != 0:
        tail = "\n".join((child.stderr or child.stdout).splitlines()[-15:])
        raise RuntimeError(
            f"the TensorFlow export process failed (exit {child.returncode}):\n{tail}")
    return pathlib.Path(json.loads(request.with_suffix(".done.json").read_text())["path"])


def _export_main(request_path):
    """The child of ``export_translation_in_tensorflow``."""
    request = json.loads(pathlib.Path(request_path).read_text())
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("the export process needs KERAS_BACKEND=tensorflow, "
                           f"got {keras.backend.backend()!r}")
    config = TranslationConfig(**request["config"])
    model = keras.saving.load_model(request["model"])
    tokenizer = prepare_tokenizer(config, [], request["workdir"])
    translator = Translator(model, tokenizer, **_search_options(config))
    path = export_translation(translator, config, request["export_dir"],
                              request["warmup_sources"])
    write_json(pathlib.Path(request_path).with_suffix(".done.json"), {"path": str(path)})
    print(f"exported SavedModel to {path}", flush=True)


def _run(config, data_dir, workdir, export_dir, samples):
    return TranslationRun(config, data_dir, workdir, export_dir, samples).run()


class TranslationRun(StagedJob):
    """The translation job's stages (``keras_trm.jobs.stages``): each
    reads what the earlier ones set on ``self``. ``run()`` returns the dict
    that ``run`` documents (written to ``<workdir>/result.json``)."""

    STAGES = ("check", "prepare_data", "build", "fit", "release_training",
              "select_average", "evaluate", "export", "report")

    def __init__(self, config, data_dir, workdir, export_dir, samples):
        self.config, self.data_dir = config, data_dir
        self.workdir, self.export_dir = pathlib.Path(workdir), export_dir
        self.samples = samples
        self.job_start = time.time()

    def check(self):
        """Every setting and corpus, before anything is written."""
        config = apply_preset(self.config or TranslationConfig())
        config.validate()
        config = dataclasses.replace(config, model_name=_model_name(config))
        stop_rule(config.early_stopping)  # a bad value fails now, not after training
        if config.parallel_searches < 1:
            raise ValueError("`parallel_searches` must be >= 1, got "
                             f"parallel_searches={config.parallel_searches}")
        # Its warm-up requests (one per batch size and 8-token bucket) must
        # fit TF Serving's 1000: checked now, not after training.
        MAX_WARMUP_RECORDS = 1000  # keras_trm.export.warmup's (TensorFlow)
        buckets = -(-config.max_sequence_length // 8)
        most = MAX_WARMUP_RECORDS // buckets
        if not 0 <= config.export_jit_compile_max_batch_size <= most:
            raise ValueError(
                f"`export_jit_compile_max_batch_size` must be in [0, {most}] "
                f"(warm-up requests for {buckets} source buckets at each batch "
                f"size fit TF Serving's {MAX_WARMUP_RECORDS}), got "
                "export_jit_compile_max_batch_size="
                f"{config.export_jit_compile_max_batch_size}")
        keras.utils.set_random_seed(config.seed)
        self.config = config = dataclasses.replace(
            config, precision=apply_precision(config.precision))
        self.strategy = job_strategy(config.strategy)
        # The corpora and the vocabulary size they need: a bad file stops
        # the job now, before the run folder, a vocabulary, prepared ids or weights.
        check_inputs(config, self.data_dir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def prepare_data(self):
        """Val and test text, the vocabulary and the training stream."""
        config, workdir = self.config, self.workdir
        self.data = data = resolve_translation_data(config, self.data_dir, workdir)
        corpora = data.corpora
        print(f"data: {config.dataset} {config.source_language}->"
              f"{config.target_language} ({data.data_dir or 'files'}); "
              f"train {' + '.join(c[0] for c in corpora)}; "
              f"validation {data.names['validation']}: {len(data.validation[0]):,}, "
              f"test {data.names['test']}: {len(data.test[0]):,}"
              + (f" (smoke run: the first {config.limit} pairs of each split)"
                 if config.limit else ""), flush=True)
        self.tokenizer = prepare_tokenizer(config, corpora, workdir)
        self.num_workers, self.worker_index, self.is_chief = (
            worker_info(self.strategy) if keras.backend.backend() == "tensorflow"
            else (1, 0, True))
        self.boundaries = boundaries = bucket_boundaries(
            train_length(config), parse_boundaries(config.boundaries))
        self.position = DataPosition()  # where a resumed run re-enters the stream
        # Two processes must not write one folder: workers prepare their own.
        folder = workdir / ("prepared" if self.is_chief
                            else f"prepared_worker{self.worker_index}")
        self.stream = stream = prepare_training_batches(
            config, corpora, self.tokenizer, folder, boundaries, self.position,
            self.num_workers, self.worker_index)
        manifest = stream["manifest"]
        for name, _, _ in corpora:
            m = manifest["splits"][name]
            print(f"{name}: {m['pairs']:,} of {m['lines']:,} pairs kept "
                  f"({m['blank']:,} blank, {m['too_long']:,} over "
                  f"{train_length(config)} tokens) in {folder}"
                  f"{' (reused)' if manifest['reused'] else ''}", flush=True)
        if stream["weights"] is not None:
            print("sampling weights: " + ", ".join(
                f"{c[0]} {w:g}" for c, w in zip(corpora, stream["weights"])), flush=True)
        print(f"{stream['steps_per_epoch']} batches per epoch in "
              f"{len(stream['batches'].shapes)} shapes ({', '.join(f'{b}x{L}' for b, L in stream['batches'].shapes)}); "
              f"vocabulary {len(self.tokenizer.vocabulary)}", flush=True)

    def build(self):
        """The model, compiled with the paper's recipe."""
        config, strategy = self.config, self.strategy
        accumulate = accumulation_steps(config.tokens_per_step, config.tokens_per_batch,
                                        strategy.num_replicas_in_sync)
        with strategy.scope():
            self.model = model = transformer(
                len(self.tokenizer.vocabulary), num_layers=config.num_layers,
                d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
                dropout_rate=config.dropout_rate,
                attention_dropout_rate=config.attention_dropout_rate,
                max_sequence_length=config.max_sequence_length,
                name=config.model_name,
            )
            schedule = NoamSchedule(config.d_model, config.warmup_steps,
                                    config.lr_scale)
            if accumulate > 1:  # the schedule counts updates, not micro-batches
                schedule = PerUpdateSchedule(schedule, accumulate)
            model.compile(
                optimizer=paper_adam(
                    schedule, weight_decay=config.weight_decay,
                    gradient_accumulation_steps=accumulate if accumulate > 1 else None),
                loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                metrics=[MaskedAccuracy(), TokenCount()],
                # JAX: always compiled (without jax.jit Keras runs the step
                # op by op); TensorFlow: as the flag says.
                jit_compile=keras.backend.backend() == "jax" or resolve_jit_compile(
                    {"on": True, "off": False}.get(config.jit_compile, "auto"),
                    strategy,
                ),
            )
        print(f"model: {model.count_params():,} parameters", flush=True)
        if accumulate > 1:
            print(f"{accumulate} micro-batches of {config.tokens_per_batch} tokens x "
                  f"{strategy.num_replicas_in_sync} replica(s) per update "
                  f"(tokens_per_step={config.tokens_per_step})", flush=True)

    def fit(self):
        """Trains with the backup, epoch checkpoints, val BLEU and the time
        budget; a non-chief worker's job ends here."""
        config, model, workdir, stream = self.config, self.model, self.workdir, self.stream
        train = stream["batches"]
        if keras.backend.backend() == "tensorflow":
            train = tf_dataset(train)
        if self.num_workers > 1:  # one global step = one batch of each worker
            local_train = train
            train = self.strategy.distribute_datasets_from_function(lambda _: local_train)
            build_for_distributed_fit(model, self.strategy, local_train)
        self.budget = budget = TimeBudget(config.time_budget_minutes * 60)
        self.checkpoints = checkpoints = EpochCheckpoints(
            workdir / "checkpoints", keep=config.average_last,
            every_steps=config.checkpoint_every_steps,
            every_minutes=config.checkpoint_every_minutes, write=self.is_chief)
        writer = (tensorboard_writer(workdir / "tensorboard")
                  if config.tensorboard == "on" and self.is_chief else None)
        self.val_bleu = GreedyBleu(model, self.tokenizer, *self.data.validation)
        self.bleu_log = bleu_log = BleuLog(
            self.val_bleu, workdir / "epochs.json", config.eval_every_epochs,
            clock=budget.elapsed, writer=writer, write=self.is_chief)
        # Non-chief workers keep their own backup (they restore from it);
        # the chief's is workdir/backup.
        backup = TrainingBackup(
            workdir / ("backup" if self.is_chief else f"backup_worker{self.worker_index}"),
            save_freq=config.save_freq, position=self.position,
            steps_per_epoch=stream["steps_per_epoch"],
            batches_per_epoch=stream["steps_per_epoch"], num_workers=1,  # own share
            stateful={"time_budget": budget, "bleu_log": bleu_log,
                      "checkpoints": checkpoints},
            fingerprint={**run_fingerprint(config),
                         "prepared": stream["manifest"]["key"]})
        callbacks = [backup, checkpoints, bleu_log, budget]
        if writer is not None:
            callbacks.append(TensorBoardScalars(writer, config.tensorboard_every_steps))
        model.fit(
            train,
            epochs=config.epochs,
            steps_per_epoch=stream["steps_per_epoch"],
            callbacks=callbacks,
            shuffle=False,  # the token-count batches are shuffled, seeded, upstream
            verbose=1 if sys.stdout.isatty() else 2,
        )
        self.train_seconds = budget.elapsed()
        if not self.is_chief:  # only the chief averages, writes, decodes and exports
            return {"worker": self.worker_index, "test_bleu": None,
                    "parameters": int(model.count_params()),
                    "epochs": len(bleu_log.history),
                    "train_minutes": round(self.train_seconds / 60, 1),
                    "job_minutes": round((time.time() - self.job_start) / 60, 1),
                    "export": None}

    def release_training(self):
        """Training is over: its step function (the traced graphs) and the
        data stream go, so that averaging, decoding and the export reuse
        their memory instead of adding to it (the job's peak RSS; see
        docs/measurements.md, "The translation job's memory")."""
        self.model.train_function = None
        self.stream = {k: v for k, v in self.stream.items() if k != "batches"}
        release_freed_memory()

    def select_average(self):
        """How many of the last checkpoints to average: chosen by greedy
        BLEU on val (the test set plays no part in it)."""
        self.averaged, self.average_scores = select_checkpoint_average(
            self.model, self.checkpoints.paths, self.val_bleu, self.config.average_last)
        print("greedy val BLEU of the average of the last k checkpoints: "
              + ", ".join(f"k={k}: {b:.2f}" for k, b in self.average_scores.items())
              + f" -> averaging the last {self.averaged}", flush=True)
        with atomic_file(self.workdir / "model.keras", suffix=".keras") as tmp:
            self.model.save(tmp)
        release_freed_memory()  # the checkpoints' and the .keras file's buffers

    def evaluate(self):
        """Test decoding, once, and its BLEU figures."""
        config = self.config
        # Test decoding and the export compute in float32 whatever the
        # training precision: the same weights, no per-step casts, portable
        # to CPUs without native bfloat16.
        self.translator = Translator(self.val_bleu.float32_model(self.model),
                                     self.tokenizer, **_search_options(config))
        test_src, test_tgt = self.data.test
        test_name = self.data.names["test"]
        self.test = {"test_bleu": None, "test_bleu_line": None,
                     "test_tokenized_compound_split_bleu": None,
                     "test_tokenized_compound_split_bleu_line": None,
                     "test_lowercase_tokenized_bleu": None,
                     "test_lowercase_tokenized_bleu_line": None}
        self.signature, self.decode_seconds = None, 0.0
        if not test_src:
            return
        t0 = time.time()
        hyps = self.translator.translate_texts(test_src, progress=True)
        self.decode_seconds = time.time() - t0
        bleu, self.signature, line = corpus_bleu(hyps, test_tgt)
        print(f"{test_name}: {line}\nsacreBLEU signature: {self.signature}", flush=True)
        # The paper's figure (t2t's get_ende_bleu.sh): tokenized BLEU with
        # compound splitting, on the same outputs.
        tok_bleu, tok_line = compound_split_bleu(hyps, test_tgt, config.target_language)
        print(f"{test_name}: tokenized BLEU with compound splitting {tok_bleu:.2f} "
              f"({tok_line})", flush=True)
        # The Multi30k papers' figure (lower-cased, tokenized; Wu et al. 2021).
        low_bleu, low_line = tokenized_bleu(hyps, test_tgt, config.target_language)
        print(f"{test_name}: lower-cased tokenized BLEU {low_bleu:.2f} ({low_line})",
              flush=True)
        atomic_write(self.workdir / f"{test_name}.hyp.{config.target_language}",
                     "\n".join(hyps) + "\n")
        release_freed_memory()  # before the export builds its graphs
        self.test.update({
            "test_bleu": round(bleu, 2), "test_bleu_line": line,
            "test_tokenized_compound_split_bleu": round(tok_bleu, 2),
            "test_tokenized_compound_split_bleu_line": tok_line,
            "test_lowercase_tokenized_bleu": round(low_bleu, 2),
            "test_lowercase_tokenized_bleu_line": low_line})

    def export(self):
        """The raw-text SavedModel, then the sample translations. A failed
        export (e.g. export_dir's disk full) must not lose the results: it
        is recorded by ``report``, which writes them and raises it."""
        config, translator = self.config, self.translator
        self.export_path = self.export_error = self.export_command = None
        val_src = self.data.validation[0]
        try:
            if keras.backend.backend() == "tensorflow":
                self.export_path = export_translation(
                    translator, config, self.export_dir, val_src)
            else:
                # The float32 model that decoded test, as the export's graph.
                model_path = self.workdir / "model_float32.keras"
                with atomic_file(model_path, suffix=".keras") as tmp:
                    translator.model.save(tmp)
                command = export_request(model_path, config, self.workdir,
                                         self.export_dir, val_src)
                if not tensorflow_installed():
                    self.export_command = command
                    print("no TensorFlow here, so no SavedModel: on a machine with "
                          f"TensorFlow and this workdir, run\n  {command}", flush=True)
                else:
                    self.export_path = export_translation_in_tensorflow(command)
            if self.export_path is not None:
                print(f"exported SavedModel to {self.export_path}", flush=True)
        except Exception as error:  # noqa: BLE001 -- re-raised by report
            self.export_error = error
            print(f"export to {self.export_dir} failed: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)
        for sentence in self.samples:
            out = translator.translate_texts([sentence])[0]
            print(f"  {config.source_language.upper()}: {sentence}\n"
                  f"  {config.target_language.upper()}: {out}", flush=True)

    def report(self):
        """``<workdir>/result.json``; raises a failed export's error after."""
        config, corpora, stream = self.config, self.data.corpora, self.stream
        path, error = self.export_path, self.export_error
        test_src = self.data.test[0]
        self.result = {
            **self.test,
            "test_split": self.data.names["test"],
            "validation_split": self.data.names["validation"],
            "train_split": "+".join(c[0] for c in corpora),
            "train_pairs": {c[0]: stream["manifest"]["splits"][c[0]]["pairs"]
                            for c in corpora},
            "train_weights": stream["weights"],
            "direction": f"{config.source_language}-{config.target_language}",
            "backend": keras.backend.backend(),
            "vocabulary": vocabulary_kind(config),
            "vocabulary_size": len(self.tokenizer.vocabulary),
            "signature": self.signature,
            "parameters": int(self.model.count_params()),
            "epochs": len(self.bleu_log.history),
            "averaged_checkpoints": self.averaged,
            "val_greedy_bleu_by_average": self.average_scores,
            "train_minutes": round(self.train_seconds / 60, 1),
            "job_minutes": round((time.time() - self.job_start) / 60, 1),
            "bucket_boundaries": list(self.boundaries),
            "train_real_target_tokens_per_epoch": sum(
                stream["manifest"]["splits"][c[0]]["target_tokens"] for c in corpora),
            "beam_decode_sentences_per_second": (
                round(len(test_src) / self.decode_seconds, 1)
                if self.decode_seconds else None),
            "export": None if path is None else str(path),
            "export_command": self.export_command,
            "export_error": None if error is None else f"{type(error).__name__}: {error}",
            "stage_seconds": dict(self.stage_seconds),  # the stages before this one
            "epochs_log": self.bleu_log.history,
            "config": dataclasses.asdict(config),
        }
        write_json(self.workdir / "result.json", self.result)
        if error is not None:
            error.add_note(
                f"the results are in {self.workdir / 'result.json'} (\"export\": null, "
                "\"export_error\"); run the same command again to export (training "
                "is not repeated: it resumes from its finished backup)")
            raise error
