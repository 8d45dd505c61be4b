"""The translation job: train a Transformer on any parallel corpus, in
either direction, score it with sacreBLEU, export a raw-text SavedModel and
translate a sample.

Corpora (``dataset``): Multi30k (default, EN->DE), WMT14 EN-DE (local
Europarl slice + newstest2013/2014, or tfds) and the user's own parallel
files. Validation watches and chooses (greedy BLEU every epoch, the number
of checkpoints averaged); test is decoded once, at the end, with beam
search. A killed run resumes from ``workdir/backup`` (written every
``save_freq`` steps and every epoch) when the same command runs again.

Used by ``recipes/translate_multi30k.py``, ``recipes/translate_wmt14.py``
and ``keras-trm train-translation``.
"""

import contextlib
import dataclasses
import json
import pathlib
import sys
import time
from typing import Optional

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
from keras_trm.data.prepared import file_identity
from keras_trm.decoding import GreedyBleu, Translator, corpus_bleu
from keras_trm.decoding.bleu import compound_split_bleu, tokenized_bleu
from keras_trm.jobs import export_elsewhere, tensorflow_installed
from keras_trm.jobs._setup import export_from_request
from keras_trm.jobs.stages import StagedJob
from keras_trm.jobs.translation_config import (
    DEFAULT_MODEL_NAME,
    VOCABULARIES,
    TranslationConfig,
    _parse_weights,
    train_length,
)
from keras_trm.utils.formats import MAX_WARMUP_RECORDS
from keras_trm.utils.memory import release_freed_memory
from keras_trm.models import transformer
from keras_trm.text import HostSentencePieceTokenizer, learn_sentencepiece
from keras_trm.training.processes import (
    ChiefStops,
    JaxProcesses,
    SameResumeStep,
    local_copy,
    no_distribution,
    on_this_process,
)
from keras_trm.training import (
    BleuLog,
    BudgetDecay,
    DataPosition,
    EpochCheckpoints,
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    NoamSchedule,
    PerUpdateSchedule,
    StepTimes,
    TensorBoardScalars,
    TimeBudget,
    TokenCount,
    TrainingBackup,
    accumulation_steps,
    apply_precision,
    apply_preset,
    paper_adam,
    select_checkpoint_average,
    tensorboard_writer,
)
from keras_trm.utils import atomic_write, write_json
from keras_trm.utils.files import atomic_file


def vocabulary_kind(config):
    """The vocabulary a config asks for (``"auto"`` resolved)."""
    if config.vocabulary not in VOCABULARIES:
        raise ValueError(f"`vocabulary` must be one of {VOCABULARIES}, got "
                         f"vocabulary={config.vocabulary!r}")
    return "sentencepiece_bpe" if config.vocabulary == "auto" else config.vocabulary


def prepare_tokenizer(config, corpora, workdir):
    """A joint source+target tokenizer: WordPiece (``TextTokenizer``) or
    SentencePiece (``SentencePieceTokenizer``), learned once from at most
    ``config.vocabulary_sample`` training sentences (a seeded sample of the
    source files, then the target files, of ``corpora``: ``(name,
    source_path, target_path)`` tuples) and cached in ``workdir``."""
    kind = vocabulary_kind(config)
    size, workdir = config.vocabulary_size, pathlib.Path(workdir)
    paths = [c[1] for c in corpora] + [c[2] for c in corpora]
    if kind == "wordpiece":  # tensorflow-text's WordPiece: TensorFlow only
        from keras_trm.text import TextTokenizer, learn_vocabulary, load_vocabulary

        path = workdir / f"vocab_{size}.txt"
        if path.is_file():
            return TextTokenizer(load_vocabulary(path))
        print(f"learning a joint WordPiece vocabulary ({size}) ...", flush=True)
        sample = sample_lines(paths, config.vocabulary_sample, seed=config.seed)
        return TextTokenizer(learn_vocabulary(sample, size, path))
    model_type = kind.split("_", 1)[1]
    path = workdir / f"spm_{model_type}_{size}.model"
    if not path.is_file():
        print(f"learning a joint SentencePiece {model_type} vocabulary ({size}) "
              f"from at most {config.vocabulary_sample:,} sentences ...", flush=True)
        learn_sentencepiece(sample_lines(paths, config.vocabulary_sample, seed=config.seed),
                            size, path, model_type=model_type,
                            sample_size=config.vocabulary_sample, seed=config.seed)
    return HostSentencePieceTokenizer(path)


def search_tokenizer(tokenizer):
    """The tokenizer the job's searches (val BLEU, test, export) take: the
    in-graph one on TensorFlow (as the SavedModel serves it), else the host
    one."""
    in_graph = getattr(tokenizer, "in_graph", None)
    if in_graph is not None and keras.backend.backend() == "tensorflow":
        return in_graph()
    return tokenizer


def _model_name(config):
    if config.model_name != DEFAULT_MODEL_NAME or (
            config.dataset, config.source_language,
            config.target_language) == ("multi30k", "en", "de"):
        return config.model_name
    dataset = config.dataset.replace("_tfds", "")
    return f"transformer_{dataset}_{config.source_language}_{config.target_language}"


# learn_sentencepiece's defaults: a SentencePiece vocabulary's characters
# cover this share of the text; byte_fallback adds 256 pieces.
SENTENCEPIECE_COVERAGE = 0.9999
SENTENCEPIECE_BYTE_PIECES = 256
WORDPIECE_MAX_CHARACTERS = 1000  # the WordPiece learner's alphabet cap


def minimum_vocabulary_size(kind, characters):
    """The smallest ``vocabulary_size`` a vocabulary learned from text with
    these characters can have without losing any of them.

    ``wordpiece``: 4 reserved tokens plus each character twice, as a word
    and as a ``##`` continuation (whitespace, control and format characters
    excepted; at most 1000 characters, the learner's cap). Below it
    keras-hub cuts the list short, the ``##`` characters last, so words
    with them become ``[UNK]``. A necessary bound only.

    ``sentencepiece_bpe`` / ``sentencepiece_unigram``: 4 special pieces +
    256 byte pieces + the characters that cover 99.99% of the text after
    SentencePiece's ``nmt_nfkc`` normalization (whitespace as "▁"); the
    learner raises below that.

    Args:
        kind: ``"wordpiece"``, ``"sentencepiece_bpe"`` or
            ``"sentencepiece_unigram"`` (``vocabulary_kind``).
        characters: mapping character -> occurrences in the training text
            (``check_parallel_corpus``'s, summed over corpora and sides).

    Returns:
        ``(minimum, n)``: the size (tokens) and the characters it holds.

    Example:
        >>> import collections
        >>> text = collections.Counter("Ein Hund. Zwei Hunde.")
        >>> minimum_vocabulary_size("wordpiece", text)
        (24, 10)
        >>> minimum_vocabulary_size("sentencepiece_bpe", text)
        (271, 11)
    """
    import collections
    import itertools
    import unicodedata

    if kind == "wordpiece":
        n = min(WORDPIECE_MAX_CHARACTERS, sum(
            c != " " and unicodedata.category(c) not in ("Cc", "Cf") for c in characters))
        return 4 + 2 * n, n
    if not kind.startswith("sentencepiece_"):
        raise ValueError(f"`kind` must be one of {VOCABULARIES[1:]}, got kind={kind!r}")
    normalize = _sentencepiece_normalizer()
    counts = collections.Counter()
    for c, times in characters.items():
        for piece in normalize(c):
            counts[piece] += times
    ordered = sorted(counts.values(), reverse=True)
    # The most frequent pieces, each taken while the ones before it cover
    # less than SENTENCEPIECE_COVERAGE of the text.
    enough = SENTENCEPIECE_COVERAGE * sum(ordered)
    n = sum(covered < enough for covered in itertools.accumulate(ordered[:-1], initial=0))
    return 4 + SENTENCEPIECE_BYTE_PIECES + n, n


def _sentencepiece_normalizer():
    """One character -> the pieces SentencePiece's ``nmt_nfkc`` turns it
    into ("" for dropped ones, "▁" for whitespace)."""
    import sentencepiece as spm

    rule = spm.SentencePieceNormalizer(rule_name="nmt_nfkc")
    return lambda c: rule.normalize("x" + c + "y")[2:-1]


def check_inputs(config, data_dir=None):
    """Checks the corpora a translation job reads before it writes
    anything; ``run`` calls it first.

    Every training corpus, then every validation and test pair of files, is
    read once, streaming (``keras_trm.data.check_parallel_corpus``: UTF-8,
    equal line counts, text); then ``config.vocabulary_size`` must hold the
    training text's characters (``minimum_vocabulary_size``; with ``limit``,
    those of the first ``limit`` lines). Multi30k's files are fetched first
    when missing and ``config.download``; ``wmt14_tfds`` is not checked.

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
            the value: line counts, the line and byte of invalid UTF-8, ...),
            a missing file or data folder (naming the files expected and
            where), or a ``vocabulary_size`` below the minimum (naming both).

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
    import collections

    config = apply_preset(config)
    kind = vocabulary_kind(config)
    if config.dataset == "wmt14_tfds":
        return {"corpora": {}, "minimum_vocabulary_size": None}
    where = dict(source_language=config.source_language,
                 target_language=config.target_language, files=_files(config),
                 download=config.download)
    # A missing file (FileNotFoundError) or too few files named (ValueError):
    # a usage error, whose message names the files expected.
    try:
        data_dir = _data_dir(config, data_dir)
        corpora = translation_train_files(config.dataset, data_dir, **where)
        evaluation = translation_eval_files(config.dataset, data_dir, **where)
    except (FileNotFoundError, ValueError) as err:
        raise CorpusError(str(err)) from None
    reports, characters = {}, collections.Counter()
    for name, source_path, target_path in corpora:
        report = check_parallel_corpus(source_path, target_path,
                                       character_lines=config.limit)
        characters.update(report.pop("characters"))
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


def _files(config):
    """The corpus-file fields of ``config`` (the ``files`` dataset's)."""
    return {name: getattr(config, name) for name in (
        "train_source", "train_target", "validation_source",
        "validation_target", "test_source", "test_target")}


def _data_dir(config, data_dir):
    """The data folder (``resolve_data_dir``); None for ``dataset="files"``."""
    if config.dataset == "files":
        return None
    return resolve_data_dir(data_dir, must_exist=not config.download)


def _tfds_train_files(workdir, source_language, target_language):
    """tfds ``wmt14_translate/de-en`` train, written once, streaming, to
    ``workdir/wmt14_train.{src,tgt}.gz``."""
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


def token_encoder(tokenizer):
    """``encode(lines) -> list of int32 id arrays`` (no START/END) for
    ``prepare_translation_data``: the tokenizer's host ``encode`` where it
    has one (SentencePiece), else its in-graph ``tokenize`` (TensorFlow)."""
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return encode

    def encode_in_graph(lines):
        import tensorflow as tf

        ragged = tokenizer.tokenize(tf.constant(lines))
        return [row.astype("int32") for row in ragged.numpy()]

    return encode_in_graph


def vocabulary_sha256(tokenizer):
    """SHA-256 of what defines a tokenizer's ids (a SentencePiece model's
    bytes, else its vocabulary one token a line): part of the prepared
    folder's key.

    Example:

    >>> class Tok:
    ...     vocabulary = ["[PAD]", "[UNK]", "[START]", "[END]", "a"]
    >>> vocabulary_sha256(Tok())[:12]
    '220285505c53'
    """
    import hashlib

    proto = getattr(tokenizer, "model_proto", None)
    if proto is None:
        proto = ("\n".join(tokenizer.vocabulary) + "\n").encode("utf-8")
    return hashlib.sha256(bytes(proto)).hexdigest()


def prepare_training_batches(config, corpora, tokenizer, folder, boundaries,
                             position, num_processes=1, process_index=0):
    """The training batches over the corpora's token ids, prepared once
    (``prepare_translation_data``: reused while corpus files, vocabulary
    and filters match).

    Returns:
        dict: ``batches`` (an endless ``keras_trm.data.TokenBatches``,
        resuming from ``position``), ``steps_per_epoch``, ``manifest``
        (with ``reused``), ``weights`` (None: one corpus, every pair once
        an epoch).
    """
    weights = _parse_weights(config.train_weights)
    if weights is not None and len(weights) != len(corpora):
        raise ValueError(
            f"`train_weights` must give one number >= 0 per training corpus "
            f"({len(corpora)}: {', '.join(c[0] for c in corpora)}) with a positive sum, "
            f"got train_weights={config.train_weights!r}")
    vocabulary = len(tokenizer.vocabulary)
    manifest = prepare_translation_data(
        folder, corpora, token_encoder(tokenizer), vocabulary,
        vocabulary_sha256(tokenizer), max_train_length=train_length(config),
        max_file_mib=config.max_file_mib)
    # A reused folder is checked (sizes, SHA-256, ids); a new one only opened.
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


def first_lines(corpora, n, workdir, languages=("source", "target")):
    """The first ``n`` lines of each corpus (smoke runs, ``limit``),
    written to ``workdir/limit_<n>/``; returns the corpora as
    ``(name, source_path, target_path)`` tuples over those copies.

    Each copy, ``<name>.<language>.gz`` (``languages``: the ``(source,
    target)`` codes), is keyed to the file it was copied from (path, size,
    modification time, in ``<copy>.key.json``) and written again when that
    key changes (direction, data folder or file) -- never a copy of other
    text.
    """
    import gzip
    import itertools

    folder = pathlib.Path(workdir) / f"limit_{n}"
    out = []
    for name, *paths in corpora:
        copies = []
        for language, path in zip(languages, paths):
            copy = folder / f"{name}.{language}.gz"
            key_path = folder / f"{copy.name}.key.json"
            key = {"source": file_identity(path), "lines": int(n)}
            try:
                current = json.loads(key_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                current = None
            if current != key or not copy.is_file():
                key_path.unlink(missing_ok=True)  # no stale key over a new copy
                with atomic_file(copy) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as f:
                    f.writelines(line + "\n" for line in itertools.islice(iter_lines(path), n))
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
    and the val and test pairs as ``(sources, targets)`` lists of str."""

    data_dir: Optional[pathlib.Path]
    names: dict
    corpora: list
    validation: tuple
    test: tuple


def resolve_translation_data(config, data_dir, workdir):
    """The corpora a translation config names, as the job and
    ``keras-trm prepare-translation`` read them: val and test loaded, the
    training corpora located (tfds' WMT14 written once to ``workdir``),
    ``limit`` (first lines of each training corpus copied to ``workdir``)
    and ``validation_limit`` applied.

    Args:
        config: a validated ``TranslationConfig``.
        data_dir: the ``--data_dir`` flag (None: the default folder).
        workdir: the run folder (``pathlib.Path``).

    Returns:
        ``TranslationData``.

    Raises:
        FileNotFoundError / CorpusError: as ``load_translation_splits``
            and ``translation_train_files`` (``check_inputs`` runs first).
    """
    data_dir, files = _data_dir(config, data_dir), _files(config)
    languages = (config.source_language, config.target_language)
    splits = load_translation_splits(config.dataset, data_dir, *languages, files=files,
                                     download=config.download, include_train=False)
    if config.dataset == "wmt14_tfds":
        corpora = _tfds_train_files(workdir, *languages)
    else:
        corpora = translation_train_files(config.dataset, data_dir, *languages,
                                          files=files, download=config.download)
    val, test = tuple(splits.validation), tuple(splits.test)
    if config.limit:  # the vocabulary too is learned from the first n pairs
        val, test = (tuple(x[:config.limit] for x in pair) for pair in (val, test))
        corpora = first_lines(corpora, config.limit, workdir, languages)
    if config.validation_limit:
        val = tuple(x[:config.validation_limit] for x in val)
    return TranslationData(data_dir, dict(splits.names), corpora, val, test)


def job_jit_compile(choice, strategy=None):
    """``fit``'s ``jit_compile`` for the job's setting (``"on"``, ``"off"``,
    ``"auto"``): XLA (TensorFlow; ``"auto"`` as ``resolve_jit_compile``),
    ``jax.jit`` (JAX: always, else Keras runs the step op by op),
    ``torch.compile`` (PyTorch; ``"auto"`` is off).

    Example:

    >>> job_jit_compile("on")
    True
    """
    backend = keras.backend.backend()
    if backend == "jax":
        return True
    if backend == "tensorflow":
        from keras_trm.training.distribute import resolve_jit_compile

        return resolve_jit_compile({"on": True, "off": False}.get(choice, "auto"),
                                   strategy)
    return choice == "on"


class _OneDevice:
    """The job's strategy off TensorFlow: one process, Keras' own device
    placement (``tf.distribute`` is TensorFlow's)."""

    num_replicas_in_sync = num_workers = 1
    worker_index, is_chief = 0, True
    scope = staticmethod(contextlib.nullcontext)


def job_strategy(kind):
    """``make_strategy(kind)`` on TensorFlow; under JAX ``"multi_worker"``
    is ``keras_trm.training.processes.JaxProcesses`` (the processes of
    ``KERAS_DISTRIBUTION_*``); otherwise only ``"default"``.

    Raises:
        ValueError: ``mirrored`` off TensorFlow, ``multi_worker`` under
            PyTorch; a missing or bad cluster variable.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from keras_trm.training.distribute import make_strategy

        return make_strategy(kind)
    if kind == "multi_worker" and backend == "jax":
        return JaxProcesses()
    if kind != "default":
        raise ValueError(f"`strategy`={kind!r} is TensorFlow's tf.distribute"
                         f"{' (JAX takes multi_worker)' if backend == 'jax' else ''}; "
                         f"under KERAS_BACKEND={backend} use 'default'")
    return _OneDevice()


def tf_dataset(batches):
    """``batches`` (``TokenBatches``) as the ``tf.data.Dataset`` that
    TensorFlow's ``fit`` and ``tf.distribute`` take, of shapes ``(None,
    None)`` (Keras' PyDataset adapter fixes the dimensions its first two
    batches agree on, refusing a later bucket's width)."""
    import itertools
    import weakref

    import tensorflow as tf

    # TensorFlow keeps a generator's state past its dataset (a C++
    # registry): holding the batches weakly lets them go with the dataset.
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

    Keras' global dtype policy is set from ``config.precision`` and put
    back when the job ends (also on an error).

    A full disk loses nothing (files are written under a temporary name
    and renamed into place):

    - ``workdir`` full during training: the backup or checkpoint write
      raises ``OSError`` (``errno.ENOSPC``, naming the file and the space
      needed and free); the same command run again once there is space
      resumes from the previous, complete, backup.
    - the export fails (e.g. ``export_dir`` full): ``result.json`` is still
      written, with ``"export": null`` and ``"export_error"``, then the
      export's error is raised. The same command run again trains no
      further and decodes and exports again.
    """
    previous_policy = keras.config.dtype_policy()
    try:
        return TranslationRun(config, data_dir, workdir, export_dir, samples).run()
    finally:
        keras.config.set_dtype_policy(previous_policy)


def _search_options(config):
    """The ``Translator`` search arguments of a job's config."""
    return dict(search=config.search(),
                parallel_searches=config.parallel_searches)


def export_translation(translator, config, export_dir, warmup_sources=()):
    """Writes ``translator`` (a float32 model and its tokenizer) as the job's
    raw-text SavedModel, ``<export_dir>/<config.model_name>/<version>/``,
    with ``vocab.txt`` and ``config.json`` in its assets; with
    ``config.export_jit_compile_max_batch_size`` its search is the XLA one
    for small batches, with warm-up requests built from ``warmup_sources``
    (str, e.g. the val sources). TensorFlow backend only.

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
    """Writes ``<workdir>/export_request.json``, what the SavedModel export
    of a model trained under JAX or PyTorch needs; returns the command that
    runs it with TensorFlow (``keras-trm export-translation --workdir
    WORKDIR``)."""
    workdir = pathlib.Path(workdir)
    # Relative to the workdir: the folder may be exported on another machine.
    write_json(workdir / "export_request.json", {
        "model": str(pathlib.Path(model_path).resolve().relative_to(workdir.resolve())),
        "export_dir": str(export_dir),
        "config": dataclasses.asdict(config),
        "warmup_sources": list(warmup_sources)})
    return f"keras-trm export-translation --workdir {workdir}"


def export_main(workdir):
    """``keras-trm export-translation --workdir DIR`` (the child of
    ``export_in_tensorflow``): the SavedModel from the run's
    ``export_request.json``; writes ``export_request.done.json``."""
    workdir = pathlib.Path(workdir)

    def export(model, request):
        config = TranslationConfig(**request["config"])
        tokenizer = search_tokenizer(prepare_tokenizer(config, [], workdir))
        translator = Translator(model, tokenizer, **_search_options(config))
        return export_translation(translator, config, request["export_dir"],
                                  request["warmup_sources"])

    return export_from_request(workdir, export)


class TranslationRun(StagedJob):
    """The translation job's stages (``keras_trm.jobs.stages``); ``run()``
    returns the dict that ``run`` documents (``<workdir>/result.json``)."""

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
        # The export's warm-up requests: one per batch size and 8-token bucket.
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
        check_inputs(config, self.data_dir)  # before anything is written
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
        if keras.backend.backend() == "tensorflow":
            from keras_trm.training.distribute import worker_info

            self.num_workers, self.worker_index, self.is_chief = worker_info(
                self.strategy)
        else:
            s = self.strategy
            self.num_workers, self.worker_index, self.is_chief = (
                s.num_workers, s.worker_index, s.is_chief)
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
        shapes = stream["batches"].shapes
        print(f"{stream['steps_per_epoch']} batches per epoch in {len(shapes)} shapes "
              f"({', '.join(f'{b}x{L}' for b, L in shapes)}); "
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
            self.budget_decay = None
            if config.budget_schedule == "fit":  # TimeBudget fits it (fit())
                if self.num_workers > 1:  # each would fit a rate to its own clock
                    raise ValueError("`budget_schedule`='fit' is not supported with "
                                     f"several workers (num_workers={self.num_workers}); "
                                     "use 'cut'")
                schedule = self.budget_decay = BudgetDecay(schedule)
            model.compile(
                optimizer=paper_adam(
                    schedule, weight_decay=config.weight_decay,
                    gradient_accumulation_steps=accumulate if accumulate > 1 else None),
                loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                metrics=[MaskedAccuracy(), TokenCount()],
                jit_compile=job_jit_compile(config.jit_compile, strategy),
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
        if self.num_workers > 1 and keras.backend.backend() == "tensorflow":
            # One global step = one batch of each worker.
            local_train = train
            train = self.strategy.distribute_datasets_from_function(lambda _: local_train)
            from keras_trm.training.distribute import build_for_distributed_fit

            build_for_distributed_fit(model, self.strategy, local_train)
        if self.is_chief:  # the plan, on the first screen
            print(f"plan: up to {config.epochs} epochs of {stream['steps_per_epoch']} "
                  f"batches within {config.time_budget_minutes:.3g} min of training "
                  f"(budget_schedule={config.budget_schedule}); checkpoints and "
                  f"result.json in {workdir}, the export in {self.export_dir}",
                  flush=True)
        self.budget = budget = TimeBudget(
            config.time_budget_minutes * 60, schedule=self.budget_decay,
            steps_per_epoch=stream["steps_per_epoch"], epochs=config.epochs)
        self.checkpoints = checkpoints = EpochCheckpoints(
            workdir / "checkpoints", keep=config.average_last,
            every_steps=config.checkpoint_every_steps,
            every_minutes=config.checkpoint_every_minutes, write=self.is_chief)
        writer = None
        if config.tensorboard == "on" and self.is_chief:
            if tensorflow_installed():  # tf.summary writes the event files
                writer = tensorboard_writer(workdir / "tensorboard")
            else:
                print("tensorboard: off (it writes through TensorFlow, which is "
                      "not installed here)", flush=True)
        # Only the chief decodes; under JAX processes on a copy of its own.
        processes = isinstance(self.strategy, JaxProcesses)
        self.val_bleu = score = None
        if self.is_chief:
            with no_distribution() if processes else contextlib.nullcontext():
                self.val_bleu = GreedyBleu(local_copy(model) if processes else model,
                                           search_tokenizer(self.tokenizer),
                                           *self.data.validation)
            score = on_this_process(self.val_bleu) if processes else self.val_bleu
        self.bleu_log = bleu_log = BleuLog(
            score, workdir / "epochs.json", config.eval_every_epochs,
            clock=budget.elapsed, writer=writer, write=self.is_chief)
        # Each worker restores from its own backup; the chief's is workdir/backup.
        backup_dir = workdir / ("backup" if self.is_chief
                                else f"backup_worker{self.worker_index}")
        backup = TrainingBackup(
            backup_dir, save_freq=config.save_freq, position=self.position,
            steps_per_epoch=stream["steps_per_epoch"],
            batches_per_epoch=stream["steps_per_epoch"], num_workers=1,  # own share
            stateful={"time_budget": budget, "bleu_log": bleu_log,
                      "checkpoints": checkpoints},
            fingerprint={**run_fingerprint(config),
                         "prepared": stream["manifest"]["key"]})
        self.step_times = StepTimes(stream["batches"].shape_at)
        callbacks = [backup, checkpoints, bleu_log, budget, self.step_times]
        if writer is not None:
            callbacks.append(TensorBoardScalars(writer, config.tensorboard_every_steps))
        if processes:  # the same resumed step and stop decision everywhere
            callbacks = [SameResumeStep(backup_dir), *callbacks, ChiefStops()]
        model.fit(
            train,
            epochs=config.epochs,
            steps_per_epoch=stream["steps_per_epoch"],
            callbacks=callbacks,
            shuffle=False,  # the token-count batches are shuffled, seeded, upstream
            verbose=1 if sys.stdout.isatty() else 2,
        )
        self.train_seconds = budget.elapsed()
        if processes:  # the chief goes on alone, on a copy of its own
            self.model = self.strategy.end(model)
        print(f"compiling the step took {self.step_times.compile_seconds:.1f} s over "
              f"{self.step_times.shapes} batch shapes (of "
              f"{self.train_seconds / 60:.1f} min of training)", flush=True)
        if not self.is_chief:  # only the chief averages, writes, decodes and exports
            return {"worker": self.worker_index, "test_bleu": None,
                    "parameters": int(model.count_params()),
                    "epochs": len(bleu_log.history),
                    "train_minutes": round(self.train_seconds / 60, 1),
                    "job_minutes": round((time.time() - self.job_start) / 60, 1),
                    "export": None}

    def release_training(self):
        """Drops the step function (traced graphs) and the data stream, so
        that averaging, decoding and the export reuse their memory (see
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
        # training precision (no per-step casts, CPUs without bfloat16).
        self.translator = Translator(self.val_bleu.float32_model(self.model),
                                     search_tokenizer(self.tokenizer),
                                     **_search_options(config))
        test_src, test_tgt = self.data.test
        test_name = self.data.names["test"]
        self.test = dict.fromkeys(
            f"test_{name}{line}" for name in ("bleu", "tokenized_compound_split_bleu",
                                             "lowercase_tokenized_bleu")
            for line in ("", "_line"))
        self.signature, self.decode_seconds = None, 0.0
        if not test_src:
            return
        t0 = time.time()
        hyps = self.translator.translate_texts(test_src, progress=True)
        self.decode_seconds = time.time() - t0
        bleu, self.signature, line = corpus_bleu(hyps, test_tgt)
        print(f"{test_name}: {line}\nsacreBLEU signature: {self.signature}", flush=True)
        self.test.update(test_bleu=round(bleu, 2), test_bleu_line=line)
        # The paper's figure (t2t's get_ende_bleu.sh) and the Multi30k papers'
        # (Wu et al. 2021), on the same outputs.
        for key, what, score in (
                ("tokenized_compound_split", "tokenized BLEU with compound splitting",
                 compound_split_bleu),
                ("lowercase_tokenized", "lower-cased tokenized BLEU", tokenized_bleu)):
            value, line = score(hyps, test_tgt, config.target_language)
            print(f"{test_name}: {what} {value:.2f} ({line})", flush=True)
            self.test.update({f"test_{key}_bleu": round(value, 2), f"test_{key}_bleu_line": line})
        atomic_write(self.workdir / f"{test_name}.hyp.{config.target_language}",
                     "\n".join(hyps) + "\n")
        release_freed_memory()  # before the export builds its graphs

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
                self.export_path, self.export_command = export_elsewhere(export_request(
                    model_path, config, self.workdir, self.export_dir, val_src))
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
            # Tracing and compiling the step per batch shape, in train_minutes.
            "compile_seconds": self.step_times.compile_seconds,
            "compiled_shapes": self.step_times.shapes,
            # The steps of the linear decay to 0 that budget_schedule="fit" fitted.
            "budget_decay_steps": ([self.budget_decay.start, self.budget_decay.end]
                                   if self.budget_decay and self.budget_decay.end
                                   else None),
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
