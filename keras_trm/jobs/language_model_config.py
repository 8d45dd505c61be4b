"""The settings of the language-model job (``keras_trm.jobs.language_model``):
``LanguageModelConfig``, its corpora and their recipes.

It imports neither Keras nor TensorFlow, so that ``keras-trm train-lm
--help`` lists the flags without starting TensorFlow.
"""

import dataclasses
import pathlib
import re
from typing import Literal, get_args

from keras_trm.jobs.translation_config import Precision
from keras_trm.utils import checks as v

# ``keras_trm.data.language_modeling.Level`` (that package imports Keras).
Level = Literal["char", "word"]

Corpus = Literal["tinyshakespeare", "ptb", "file"]
CORPORA = get_args(Corpus)

# A corpus's recipe where it differs from the defaults (Tiny Shakespeare's).
# PTB: 60 minutes on a 2-core CPU, set by hand and checked on valid
# (docs/recipes/language-model.md).
CORPUS_RECIPES = {
    "ptb": dict(d_model=256, d_ff=1024, dropout_rate=0.3,
                attention_dropout_rate=0.1, steps=20_000, time_budget_minutes=60.0,
                precision="auto", warmup_steps=400, eval_every=500),
}


@dataclasses.dataclass
class LanguageModelConfig:
    """Hyper-parameters of the language-model recipe (defaults: the CPU
    run the README reports, char-level Tiny Shakespeare)."""

    corpus: Corpus = "tinyshakespeare"
    """Corpus: char-level Tiny Shakespeare, word-level PTB, or ``file``:
    ``text_file``, cut 90/5/5 % into train/valid/test
    (``keras_trm.data.load_text_file``)."""
    text_file: str = ""
    """With ``corpus: file``: the UTF-8 text file (plain or .gz)."""
    level: Level = "char"
    """With ``corpus: file``: ``char`` (characters) or ``word``
    (whitespace words, ``<eos>`` ending each line) tokens."""
    num_layers: int = 4
    """Transformer blocks (both models)."""
    d_model: int = 128
    """Model width (units)."""
    num_heads: int = 4
    """Attention heads (divides d_model)."""
    d_ff: int = 512
    """Feed-forward inner width of Transformer-XL (units; the vanilla
    model's is raised to match parameters)."""
    dropout_rate: float = 0.1
    """Dropout rate (fraction, 0-1): embeddings, residual branches, output."""
    attention_dropout_rate: float = 0.0
    """Dropout on the attention probabilities (fraction, 0-1)."""
    seg_len: int = 64
    """Segment length: tokens per training step and stream (tokens)."""
    mem_len: int = 64
    """Transformer-XL memory carried between segments (tokens)."""
    eval_mem_len: int = 0
    """Memory at evaluation (tokens; 0 = mem_len)."""
    batch_size: int = 32
    """Contiguous training streams per step (sequences)."""
    steps: int = 4500
    """Training steps, the same for both models (steps; with a
    ``time_budget_minutes``, the most)."""
    time_budget_minutes: float = 0.0
    """> 0: Transformer-XL trains at most this long (minutes of training,
    validation not counted): ``steps`` becomes the steps its measured pace
    fits in the budget and the cosine decay ends there (a whole schedule;
    Li, Yumer and Ramanan, ICLR 2020); the vanilla model trains as many.
    0: ``steps``, no budget."""
    precision: Precision = "float32"
    """Training precision (``keras_trm.training.apply_precision``; also of
    validation during training; the test split and the export use a float32
    copy with the same weights)."""
    learning_rate: float = 1e-3
    """Peak learning rate (Adam)."""
    warmup_steps: int = 100
    """Linear warm-up before the cosine decay (steps; < steps)."""
    min_learning_rate_ratio: float = 0.0
    """Learning rate at the end of the cosine decay, as a fraction of the
    peak (0-1)."""
    clip_norm: float = 0.25
    """Gradient clipping by global norm."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW, Loshchilov & Hutter 2019) of weight
    matrices and embeddings (biases and LayerNorm exempt), per unit of
    learning rate; 0: plain Adam."""
    eval_every: int = 250
    """Validation every n training steps (steps)."""
    eval_batch_size: int = 16
    """Contiguous evaluation streams (sequences)."""
    baseline: bool = True
    """Also train the vanilla Transformer on the same segments (the
    comparison); false: Transformer-XL only."""
    match_parameters: bool = True
    """Widen the vanilla model's feed-forward layer to Transformer-XL's
    parameter count."""
    train_tokens: int = 0
    """> 0: only the first n training tokens (tokens; 0 = whole split)."""
    eval_tokens: int = 0
    """> 0: only the first n validation and test tokens (tokens; 0 = whole
    split)."""
    seed: int = 0
    """Random seed (initialization, dropout)."""
    model_name: str = ""
    """Export folder name under export_dir (``""`` =
    transformer_xl_<corpus>)."""
    download: bool = True
    """Fetch data missing from the data folder (online)."""

    # The sections of the command line and YAML (``keras_trm.cli.config_keys``).
    SECTIONS = {
        "data": ("corpus", "text_file", "level", "train_tokens", "eval_tokens",
                 "download"),
        "model": ("num_layers", "d_model", "num_heads", "d_ff", "dropout_rate",
                  "attention_dropout_rate", "seg_len", "mem_len",
                  "match_parameters"),
        "training": ("batch_size", "steps", "time_budget_minutes", "precision",
                     "learning_rate", "warmup_steps", "min_learning_rate_ratio",
                     "clip_norm", "weight_decay", "eval_every", "baseline"),
        "evaluation": ("eval_mem_len", "eval_batch_size"),
        "export": ("model_name",),
    }

    @classmethod
    def flag_defaults(cls, fields):
        """The command line's defaults for ``fields["corpus"]``: its
        ``CORPUS_RECIPES`` entry."""
        return dict(CORPUS_RECIPES.get(fields.get("corpus"), {}))

    @classmethod
    def recipe(cls, corpus="tinyshakespeare", **fields):
        """The recipe's configuration of ``corpus`` (the command line's
        defaults for it), ``fields`` overriding it.

        Example:
        >>> LanguageModelConfig.recipe("ptb", seed=1).corpus
        'ptb'
        """
        return cls(**{**cls.flag_defaults({"corpus": corpus}), "corpus": corpus,
                      **fields})

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value, before any data is read; returns the config."""
        from keras_trm.jobs._setup import check_fields, check_folder_name
        from keras_trm.training.precision import CHOICES as PRECISIONS

        v.one_of("corpus", self.corpus, CORPORA)
        v.one_of("level", self.level, get_args(Level))
        v.one_of("precision", self.precision, PRECISIONS)
        if (self.corpus == "file") != bool(self.text_file):
            raise ValueError("`text_file` is the corpus of `corpus: file` and only "
                             f"of it; got corpus={self.corpus!r}, "
                             f"text_file={self.text_file!r}")
        check_fields(self, {
            v.boolean: ("baseline", "match_parameters", "download"),
            v.positive_int: ("num_layers", "d_model", "num_heads", "d_ff", "seg_len",
                             "batch_size", "steps", "warmup_steps", "eval_every",
                             "eval_batch_size"),
            v.non_negative_int: ("mem_len", "eval_mem_len", "train_tokens", "eval_tokens",
                                 "seed"),
            v.rate: ("dropout_rate", "attention_dropout_rate"),
            v.non_negative_float: ("time_budget_minutes", "weight_decay"),
            v.positive_float: ("learning_rate", "clip_norm"),
        })
        v.divisible("d_model", self.d_model, "num_heads", self.num_heads)
        check_folder_name("model_name", self.model_name, empty_ok=True)
        if not 0.0 <= self.min_learning_rate_ratio <= 1.0:
            raise ValueError("`min_learning_rate_ratio` must be in [0, 1], got "
                             f"min_learning_rate_ratio={self.min_learning_rate_ratio!r}")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"`warmup_steps`={self.warmup_steps} must be smaller than "
                             f"steps={self.steps}")
        return self

    @property
    def name(self):
        if self.model_name or self.corpus != "file":
            return self.model_name or f"transformer_xl_{self.corpus}"
        return "transformer_xl_" + re.sub(r"[^A-Za-z0-9_.-]", "_",
                                          pathlib.Path(self.text_file).name.split(".")[0])

    @property
    def token_level(self):
        """``char`` or ``word``: the corpus's tokens."""
        return {"tinyshakespeare": "char", "ptb": "word"}.get(self.corpus, self.level)
