"""The settings of the translation job (``keras_trm.jobs.translation``):
``TranslationConfig``, its choices and the checks of its values.

It imports neither Keras nor TensorFlow, so that ``keras-trm
train-translation --help`` lists the flags without starting TensorFlow.
"""

import dataclasses
import re
import warnings
from typing import Literal, Optional, get_args

from keras_trm.utils import checks as v


Dataset = Literal["multi30k", "wmt14", "wmt14_tfds", "files"]
StopRule = Literal["bound", "first_end", "never"]
Vocabulary = Literal["auto", "wordpiece", "sentencepiece_bpe",
                     "sentencepiece_unigram"]
Preset = Literal["cpu_small", "tiny", "transformer_base", "transformer_big"]
Strategy = Literal["default", "mirrored", "multi_worker"]
# keras_trm.training.precision.CHOICES, here for the command line's choices.
Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
OnOff = Literal["on", "off"]
OnOffAuto = Literal["auto", "on", "off"]
BudgetSchedule = Literal["cut", "fit"]
VOCABULARIES = get_args(Vocabulary)
DEFAULT_MODEL_NAME = "transformer_multi30k_en_de"
_LANGUAGE = re.compile(r"[A-Za-z0-9_-]+")


@dataclasses.dataclass
class TranslationConfig:
    """Corpus, vocabulary and hyper-parameters of a translation job
    (defaults: the Multi30k EN->DE CPU run the README reports).

    ``preset`` (``keras_trm.training.presets``) fills the hyper-parameters
    left at their defaults; explicit values win.
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
    corpus (``1,3``: the second corpus three times as often as the first);
    empty: proportional to their sizes. ``wmt14`` has two corpora when the
    newstest2008-2022 pool is in the data folder: Europarl, then the pool."""
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
    paper's shared BPE; for Multi30k chosen on val,
    ``docs/recipes/multi30k.md``)."""
    vocabulary_sample: int = 1_000_000
    """The most training sentences the vocabulary is learned from."""
    validation_limit: int = 0
    """> 0: the greedy validation BLEU of each epoch uses the first n
    pairs only (pairs; 0 = all)."""
    preset: Preset = "cpu_small"
    """Hyper-parameter preset (``keras_trm.training.presets``): fills the
    fields left at their defaults; ``cpu_small`` is these defaults."""

    vocabulary_size: int = 10000
    """Subword vocabulary size (tokens, shared by both languages); 10,000
    for Multi30k, chosen on val (``docs/recipes/multi30k.md``)."""
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
    then that length). Each bucket is one batch shape (one ``jax.jit``
    compilation under JAX): fewer buckets compile faster and pad more."""
    max_length: Optional[int] = None
    """Deprecated: ``max_sequence_length`` and ``max_train_length`` in one
    (tokens); it sets ``max_sequence_length`` to it and ``max_train_length``
    to null (the same value)."""
    label_smoothing: float = 0.2
    """Label smoothing (epsilon_ls, fraction); 0.2 for 29,000 Multi30k
    pairs, chosen on val over the paper's 0.1 (``docs/recipes/multi30k.md``)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW, Loshchilov & Hutter 2019; fraction of
    the learning rate per update, ``paper_adam(weight_decay=)``) of weight
    matrices and embeddings; biases and LayerNorm are exempt. 0: none, as
    in the paper (0.1 did not help on Multi30k, ``docs/recipes/multi30k.md``)."""
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
    budget_schedule: BudgetSchedule = "cut"
    """What the time budget does to the learning-rate schedule when it ends
    the run before ``epochs``: ``cut`` (the schedule stops where the budget
    stops it) or ``fit`` (measured on the first epochs, the rate decays
    linearly to 0 at the end of the last epoch the budget holds:
    ``keras_trm.training.BudgetDecay``; a resumed run keeps the decay)."""
    average_last: int = 5
    """The most epoch checkpoints averaged (the number chosen by
    validation BLEU)."""
    beam_size: int = 5
    """Beam width of the final test decoding (beams)."""
    length_penalty: float = 1.2
    """Beam search length penalty (GNMT alpha); beam 5 and 1.2 were the
    best on Multi30k val (``docs/results/multi30k_sweep.json``)."""
    early_stopping: StopRule = "bound"
    """When beam search stops a sentence (test decoding and the export):
    ``bound`` (exact: no live hypothesis can still win), ``first_end``
    (CTranslate2's early exit when the best candidate ends; faster, may
    differ with alpha > 0) or ``never`` (at the token limit)."""
    parallel_searches: int = 1
    """Searches each batch is dealt into and run at once (test decoding and
    the export; ``Translator``): 2 decoded 1.6x faster on 2 idle cores, but
    was slower behind a loaded server, so 1 suits serving
    (docs/serving.md)."""
    export_jit_compile_max_batch_size: int = 0
    """0: the export runs the graph search at every batch size. n >= 1:
    requests of at most n sentences run the search compiled by XLA
    (``Translator(jit_compile_max_batch_size=n)``, the same ids; about half
    the time for one sentence on 2 cores), compiled at load by the export's
    warm-up requests; it pays with intra-op threads > 1, and TF Serving
    needs ``--xla_cpu_compilation_enabled=true`` (docs/serving.md;
    sentences)."""
    eval_every_epochs: int = 1
    """Greedy validation BLEU every n epochs (epochs)."""
    strategy: Strategy = "default"
    """Distribution: ``default`` (one device), ``mirrored`` (TensorFlow:
    local GPUs, or 2 logical CPU devices), ``multi_worker`` (TensorFlow: the
    cluster of TF_CONFIG; JAX: the processes of KERAS_DISTRIBUTION_*)."""
    jit_compile: OnOffAuto = "off"
    """Compile the training step: XLA under TensorFlow (``auto``: off for
    several CPU replicas, on otherwise), ``torch.compile`` under PyTorch
    (``auto``: off); under JAX always (``jax.jit``). See
    ``keras_trm.jobs.translation.job_jit_compile``."""
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

    # The sections of the command line and YAML (``keras_trm.cli.config_keys``);
    # preset, seed and the deprecated max_length stay at the top.
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
                     "time_budget_minutes", "budget_schedule", "average_last", "eval_every_epochs",
                     "validation_limit", "strategy", "jit_compile", "precision",
                     "checkpoint_every_steps", "checkpoint_every_minutes",
                     "save_freq", "tensorboard", "tensorboard_every_steps"),
        "decoding": ("beam_size", "length_penalty", "early_stopping",
                     "parallel_searches"),
        "export": ("model_name", "export_jit_compile_max_batch_size"),
    }

    # Old field -> the fields it now sets (``keras_trm.cli.parse_config``).
    RENAMED_FIELDS = {"max_length": ("max_sequence_length", "max_train_length")}

    @classmethod
    def flag_defaults(cls, fields):
        """The command line's defaults that ``fields`` choose: ``preset``'s."""
        from keras_trm.training.presets import preset

        return preset(fields["preset"]) if fields.get("preset") else {}

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

    def search(self):
        """The ``decoding`` settings' search strategy
        (``keras_trm.decoding.search_strategy``, which raises on a bad
        setting)."""
        from keras_trm.decoding.search import search_strategy

        return search_strategy(self.beam_size, self.length_penalty,
                               self.early_stopping)

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value (``keras-trm train-translation`` makes it a usage error, exit
        2, before anything is written; ``run`` checks too)."""
        from keras_trm.data.loader import parse_boundaries
        from keras_trm.jobs._setup import check_fields, check_folder_name

        check_fields(self, {
            v.positive_int: (
                "vocabulary_size", "num_layers", "d_model", "num_heads", "d_ff",
                "max_sequence_length", "warmup_steps", "tokens_per_batch", "epochs",
                "average_last", "beam_size", "parallel_searches", "eval_every_epochs",
                "save_freq", "tensorboard_every_steps"),
            v.non_negative_int: ("seed", "limit", "tokens_per_step", "checkpoint_every_steps",
                                 "validation_limit", "export_jit_compile_max_batch_size"),
            v.rate: ("dropout_rate", "attention_dropout_rate", "label_smoothing"),
            v.non_negative_float: ("weight_decay", "checkpoint_every_minutes"),
            v.positive_float: ("time_budget_minutes", "lr_scale", "max_file_mib"),
            v.boolean: ("download",),
        })
        for name, choices in (("dataset", Dataset), ("jit_compile", OnOffAuto),
                              ("tensorboard", OnOff), ("budget_schedule", BudgetSchedule)):
            v.one_of(name, getattr(self, name), get_args(choices))
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
        self.search()
        parse_boundaries(self.boundaries)
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
    included): ``max_train_length``, else ``max_sequence_length``."""
    if config.max_train_length is None:
        return config.max_sequence_length
    return config.max_train_length


def _parse_weights(text):
    """``train_weights`` as a list of floats (None when empty); raises
    ``TypeError`` (not a str) or ``ValueError`` (not comma-separated finite
    numbers >= 0 with a positive sum)."""
    if not isinstance(text, str):
        raise TypeError(f"`train_weights` must be a str of comma-separated numbers, "
                        f"got train_weights={text!r}")
    if not text.strip():
        return None
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        weights = []
    if not weights or not all(0 <= w < float("inf") for w in weights) or sum(weights) <= 0:
        raise ValueError(
            "`train_weights` must be comma-separated finite numbers >= 0 with a "
            f"positive sum, one per training corpus, got train_weights={text!r}")
    return weights
