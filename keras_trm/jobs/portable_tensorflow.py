"""The TensorFlow ends of portable training (``keras_trm.jobs.
portable_training``): ``prepare_translation`` (``keras-trm
prepare-translation``) writes a corpus as files a machine without
TensorFlow trains on; ``export_portable`` (``keras-trm export-portable``)
turns the weights trained there into the usual raw-text SavedModel and
reports sacreBLEU.

Both follow the translation job (``keras_trm.jobs.translation``): the same
config (``TranslationConfig``, the same flags), the same input checks
(``check_inputs``), data, vocabulary (``prepare_tokenizer``), token ids
and filters (``prepare_shards``), and the same export
(``export_translation``).
"""

import dataclasses
import json
import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from keras_trm.data import prepare_shards
from keras_trm.decoding import Translator, corpus_bleu
from keras_trm.decoding.bleu import compound_split_bleu
from keras_trm.jobs import translation as job
from keras_trm.jobs.portable_files import _read_weights_info
from keras_trm.jobs.portable_files import (
    DEFAULT_MAX_FILE_MIB,
    FORMAT,
    MANIFEST,
    SPECIAL_IDS,
    WEIGHTS_MANIFEST,
    PairWriter,
    file_entry,
    load_portable_model,
    max_file_bytes,
    read_prepared,
    sha256_file,
)
from keras_trm.training import apply_preset
from keras_trm.utils.files import atomic_write, write_json

TEXT_FILES = {"validation": ("val.source.txt", "val.target.txt"),
              "test": ("test.source.txt", "test.target.txt")}


def tokenizer_file(config):
    """The file ``keras_trm.jobs.translation.prepare_tokenizer`` keeps the
    vocabulary of ``config`` in (in its folder): ``vocab_<size>.txt``
    (WordPiece) or ``spm_<bpe|unigram>_<size>.model`` (SentencePiece).

    Example:

    >>> tokenizer_file(job.TranslationConfig(vocabulary="wordpiece", vocabulary_size=8000))
    'vocab_8000.txt'
    >>> tokenizer_file(job.TranslationConfig(dataset="wmt14", vocabulary_size=37000))
    'spm_bpe_37000.model'
    """
    kind = job.vocabulary_kind(config)
    if kind == "wordpiece":
        return f"vocab_{config.vocabulary_size}.txt"
    return f"spm_{kind.split('_', 1)[1]}_{config.vocabulary_size}.model"


def copy_shards(manifest, writer, chunk=8192):
    """Appends the pairs of prepared TFRecord shards (``prepare_shards``'
    manifest), in corpus order, to a ``PairWriter``, ``chunk`` records at
    a time. Returns the number of pairs."""
    folder = pathlib.Path(manifest["directory"])
    files = [str(folder / shard["file"]) for shard in manifest["shards"]]
    pairs = 0
    for records in tf.data.TFRecordDataset(files).batch(chunk).as_numpy_iterator():
        # Each record: int32 [n_source, n_target, source ids, target ids].
        lengths = np.fromiter(map(len, records), np.int64, len(records)) // 4
        flat = np.frombuffer(b"".join(records), "<i4")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        ns, nt = flat[starts].astype(np.int64), flat[starts + 1].astype(np.int64)
        if not np.array_equal(lengths, 2 + ns + nt):
            raise ValueError(f"a record of {folder} is not [n_source, n_target, "
                             "ids...]: the shards are damaged; delete them")
        within = np.arange(flat.size) - np.repeat(starts, lengths)
        source_end = 2 + np.repeat(ns, lengths)
        writer.add(flat[(within >= 2) & (within < source_end)], ns,
                   flat[within >= source_end], nt)
        pairs += len(records)
    return pairs


def _write_lines(path, lines):
    atomic_write(path, "".join(line + "\n" for line in lines))


def read_lines(path):
    """The lines of a UTF-8 text file written by ``prepare_translation``
    (split at "\n" only, as the shards read them)."""
    text = pathlib.Path(path).read_text("utf-8")
    return text.split("\n")[:-1] if text else []


def check_settings(config, max_file_mib=DEFAULT_MAX_FILE_MIB):
    """What ``prepare_translation`` rules out besides ``config.validate()``:
    returns ``max_file_mib`` in bytes.

    Raises:
        ValueError: ``config.train_weights`` given (the corpora are
            concatenated), or ``max_file_mib`` under 16 KiB.
    """
    if config.train_weights.strip():
        raise ValueError(
            "portable training concatenates the training corpora (each pair "
            "once per epoch); `train_weights` is not supported, got "
            f"train_weights={config.train_weights!r}")
    return max_file_bytes(max_file_mib)


def prepare_translation(config=None, data_dir=None, workdir="runs/multi30k",
                        output_dir=None, max_file_mib=DEFAULT_MAX_FILE_MIB):
    """Writes a translation corpus as a *prepared folder* that
    ``keras-trm train-portable`` trains on without TensorFlow (the format
    is in ``keras_trm.jobs.portable_training``).

    As ``keras-trm train-translation`` does, and with its config: the
    inputs are checked first (``check_inputs``), the data is resolved
    (Multi30k, WMT14, tfds or the user's files; ``limit`` and
    ``validation_limit``), the vocabulary is learned (``prepare_tokenizer``;
    kept in ``output_dir`` and reused when there) and the training corpora
    are tokenized, streaming, into the job's TFRecord shards
    (``prepare_shards``, under ``workdir/shards``, reused while unchanged),
    which are then copied in chunks into ``train-NNNNN.npz``. Validation
    pairs longer than the model's ``max_sequence_length`` are left out of
    ``val-NNNNN.npz`` (the val loss); ``val.source.txt`` /
    ``val.target.txt`` keep every validation pair (BLEU), ``test.*.txt``
    the test split. Nothing holds a corpus whole in memory but the val and
    test text (as the job does).

    Several training corpora are concatenated (each pair once per epoch);
    ``train_weights`` is not supported.

    Files in ``output_dir``: ``train-NNNNN.npz``, ``val-NNNNN.npz`` (at
    most ``max_file_mib`` each), ``val.source.txt``, ``val.target.txt``,
    ``test.source.txt``, ``test.target.txt`` (when there is a test split),
    the vocabulary (``tokenizer_file``) and ``manifest.json``, written
    last (its keys: ``prepared_manifest``).

    Args:
        config: ``TranslationConfig`` (its ``preset`` is applied).
        data_dir: the data folder (``resolve_data_dir``).
        workdir: where the shards (and ``limit``'s copies) go.
        output_dir: the prepared folder (default ``workdir/portable``).
        max_file_mib: the largest ``.npz`` file (MiB).

    Returns:
        dict, the manifest.

    Raises:
        CorpusError: a bad corpus file or a ``vocabulary_size`` too small
            (``check_inputs``; nothing is written).
        ValueError: a bad config value, ``train_weights`` given, or a
            ``max_file_mib`` under 16 KiB.

    Example::

        keras-trm prepare-translation --output_dir runs/multi30k/portable
    """
    config, limit_bytes = _prepare_config(config, max_file_mib)
    job.check_inputs(config, data_dir)  # before anything is written
    workdir = pathlib.Path(workdir)
    output = pathlib.Path(output_dir) if output_dir else workdir / "portable"
    _clear_output(workdir, output)
    data = job.resolve_translation_data(config, data_dir, workdir)
    tokenizer = _learn_vocabulary(config, data.corpora, output)
    train = _write_train_ids(config, data.corpora, tokenizer, workdir, output, limit_bytes)
    validation, test = _write_eval_splits(config, data, tokenizer, workdir, output,
                                          limit_bytes)
    manifest = prepared_manifest(config, len(tokenizer.vocabulary), output,
                                 {"train": train, "validation": validation,
                                  "test": test})
    write_json(output / MANIFEST, manifest)  # last: marks the folder complete
    total = sum(f["bytes"] for f in manifest["files"].values())
    print(f"prepared {output}: {train['pairs']:,} training pairs in "
          f"{len(train['files'])} file(s), {validation['pairs']:,} val pairs, "
          f"vocabulary {len(tokenizer.vocabulary)}, {total / 2**20:.1f} MiB",
          flush=True)
    return manifest


def _prepare_config(config, max_file_mib):
    """The config ``prepare_translation`` writes (preset applied, checked,
    the model named) and ``max_file_mib`` in bytes."""
    config = apply_preset(config or job.TranslationConfig())
    config.validate()
    config = dataclasses.replace(config, model_name=job._model_name(config))
    return config, check_settings(config, max_file_mib)


def _learn_vocabulary(config, corpora, output):
    """The job's tokenizer (``prepare_tokenizer``: learned, or reused
    where ``output`` has it), its vocabulary file checked in ``output``."""
    tokenizer = job.prepare_tokenizer(config, corpora, output)
    vocabulary_file = tokenizer_file(config)
    if not (output / vocabulary_file).is_file():
        raise RuntimeError(f"prepare_tokenizer left no {vocabulary_file} in {output}")
    return tokenizer


def _clear_output(workdir, output):
    """Creates both folders and invalidates ``output`` first: a folder
    whose preparation stopped has no manifest (and no stale pair files)."""
    workdir.mkdir(parents=True, exist_ok=True)
    output.mkdir(parents=True, exist_ok=True)
    (output / MANIFEST).unlink(missing_ok=True)
    for old in list(output.glob("train-*.npz")) + list(output.glob("val-*.npz")):
        old.unlink()


def prepared_manifest(config, vocabulary_size, output, splits):
    """The ``manifest.json`` of a prepared folder (``prepare_translation``
    writes it last, once every other file is in ``output``): ``format``,
    ``created``, ``config`` (every ``TranslationConfig`` field),
    ``model`` (the ``transformer()`` arguments: vocabulary size, N,
    d_model, h, d_ff, dropout, max_sequence_length, name), ``vocabulary``
    (kind, file, size), ``special_ids`` (pad 0, unk 1, start 2, end 3),
    ``max_train_length``, ``splits`` (per split: lines, pairs, tokens,
    dropped pairs, files) and ``files`` (bytes and SHA-256 of every
    file).

    Args:
        config: the ``TranslationConfig`` (model named).
        vocabulary_size: int, the tokenizer's vocabulary size.
        output: the prepared folder.
        splits: dict ``train``, ``validation``, ``test`` (None: no test
            split), as ``_write_train_ids`` / ``_write_eval_splits`` give.
    """
    vocabulary_file = tokenizer_file(config)
    names = ([f["file"] for f in splits["train"]["files"]]
             + [f["file"] for f in splits["validation"]["files"]]
             + list(TEXT_FILES["validation"])
             + (list(TEXT_FILES["test"]) if splits["test"] else [])
             + [vocabulary_file])
    return {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": dataclasses.asdict(config),
        "model": {"vocabulary_size": vocabulary_size,
                  "num_layers": config.num_layers, "d_model": config.d_model,
                  "num_heads": config.num_heads, "d_ff": config.d_ff,
                  "dropout_rate": config.dropout_rate,
                  "attention_dropout_rate": config.attention_dropout_rate,
                  "max_sequence_length": config.max_sequence_length,
                  "name": config.model_name},
        "vocabulary": {"kind": job.vocabulary_kind(config), "file": vocabulary_file,
                       "size": vocabulary_size},
        "special_ids": dict(SPECIAL_IDS),
        "max_train_length": job.train_length(config),
        "splits": dict(splits),
        "files": {name: file_entry(output / name) for name in names},
    }


def _write_train_ids(config, corpora, tokenizer, workdir, output, limit_bytes):
    """Each training corpus tokenized into the job's shards, then copied
    into ``train-NNNNN.npz`` files; returns the manifest's train split."""
    max_train_length = job.train_length(config)
    writer = PairWriter(output, "train", limit_bytes)
    train = {"corpora": {}, "pairs": 0, "source_tokens": 0, "target_tokens": 0,
             "max_pair_length": 0}
    for name, source_path, target_path in corpora:
        shards = prepare_shards(source_path, target_path, tokenizer,
                                workdir / "shards" / name,
                                max_train_length=max_train_length,
                                pairs_per_shard=config.pairs_per_shard,
                                limit=config.limit)
        copy_shards(shards, writer)
        train["corpora"][name] = {k: shards[k] for k in (
            "lines", "blank", "too_long", "pairs", "source_tokens", "target_tokens")}
        for key in ("pairs", "source_tokens", "target_tokens"):
            train[key] += shards[key]
        train["max_pair_length"] = max(train["max_pair_length"],
                                       shards["max_pair_length"])
        print(f"{name}: {shards['pairs']:,} of {shards['lines']:,} pairs kept "
              f"({shards['blank']:,} blank, {shards['too_long']:,} over "
              f"{max_train_length} tokens)", flush=True)
    train["files"] = writer.close()
    return train


def _write_eval_splits(config, data, tokenizer, workdir, output, limit_bytes):
    """Val and test as raw text (decoded later with the SavedModel) and val
    as ids too (the val loss); returns the manifest's two splits."""
    (val_src, val_tgt), (test_src, test_tgt) = data.validation, data.test
    for role, (sources, targets) in (("validation", (val_src, val_tgt)),
                                     ("test", (test_src, test_tgt))):
        for name, lines in zip(TEXT_FILES[role], (sources, targets)):
            if sources:
                _write_lines(output / name, lines)
            else:
                (output / name).unlink(missing_ok=True)
    # Val ids: every pair the model's positions hold (the val loss).
    val_shards = prepare_shards(
        *(output / name for name in TEXT_FILES["validation"]), tokenizer,
        workdir / "portable_val_shards",
        max_train_length=config.max_sequence_length)
    writer = PairWriter(output, "val", limit_bytes)
    copy_shards(val_shards, writer)
    validation = {"name": data.names["validation"], "lines": len(val_src),
                  **{k: val_shards[k] for k in ("blank", "too_long", "pairs",
                                                 "source_tokens", "target_tokens",
                                                 "max_pair_length")},
                  "text": list(TEXT_FILES["validation"]), "files": writer.close()}
    test = ({"name": data.names["test"], "lines": len(test_src),
             "text": list(TEXT_FILES["test"])} if test_src else None)
    return validation, test


def prepared_config(manifest):
    """The ``TranslationConfig`` a prepared folder was written with (fields
    this version no longer has are left out)."""
    fields = {f.name for f in dataclasses.fields(job.TranslationConfig)}
    return job.TranslationConfig(**{k: value for k, value in manifest["config"].items()
                                    if k in fields})


def translate_with_saved_model(path, sentences, batch_size=100):
    """Translates ``sentences`` (list of str) with a raw-text SavedModel's
    ``serving_default`` signature, ``batch_size`` at a time; returns the
    list of translations."""
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    out = []
    for start in range(0, len(sentences), batch_size):
        (texts,) = serve(tf.constant(sentences[start:start + batch_size])).values()
        out.extend(t.decode("utf-8") for t in texts.numpy())
    return out


def export_portable(prepared, weights, export_dir="export", test=False,
                    beam_size=None, limit=0, batch_size=100, results_dir=None):
    """Exports weights trained by ``keras-trm train-portable`` as the
    translation job's raw-text SavedModel, then decodes val (and, with
    ``test``, the test split) with that SavedModel and reports sacreBLEU.

    The model is the prepared folder's, in float32, with the weights of
    ``weights`` (``load_portable_model``; bfloat16 files are widened);
    the tokenizer is the prepared folder's vocabulary
    (``prepare_tokenizer``); the search options (beam size, length
    penalty, stopping rule) are the prepared config's. Under the
    TensorFlow backend the export is ``export_translation``; under JAX or
    PyTorch ``export_translation_in_tensorflow`` (a TensorFlow child
    process). The same SavedModel as ``keras-trm train-translation``
    writes: ``<export_dir>/<model_name>/<version>/``.

    Args:
        prepared: the prepared folder (checked: sizes and SHA-256).
        weights: the weights folder (``<workdir>/weights`` of
            ``train-portable``; checked likewise).
        export_dir: where the SavedModel goes.
        test: also decode the test split (the final figure: use it once).
        beam_size: int >= 1 to override the config's (1: greedy).
        limit: > 0: decode only the first n sentences of each split.
        batch_size: sentences per SavedModel call.
        results_dir: where ``export_result.json`` and the hypotheses go
            (default: ``weights``).

    Returns:
        dict (also ``export_result.json``): ``export`` (the SavedModel
        path), ``beam_size``, ``validation`` and ``test`` (``bleu``,
        ``bleu_line``, ``signature``, ``sentences``, ``seconds``;
        ``test`` None without ``test``; for the test split also the
        tokenized BLEU with compound splitting, the paper's figure).

    Raises:
        FileNotFoundError / ValueError: a missing or damaged folder; weights
            of another model than the prepared folder's, or trained on
            another prepared folder (``weights.json``'s
            ``prepared_manifest_sha256`` differs from ``prepared``'s
            manifest: both folders are named).

    Example::

        keras-trm export-portable --prepared runs/multi30k/portable \\
            --weights runs/portable/weights --test
    """
    prepared, weights = pathlib.Path(prepared), pathlib.Path(weights)
    manifest = read_prepared(prepared)
    _check_weights_model(weights, prepared, manifest)
    config = _export_config(manifest, beam_size)
    model = load_portable_model(weights, dtype="float32")  # checks the files
    path = _export_saved_model(model, config, prepared, export_dir)
    print(f"exported SavedModel to {path}", flush=True)

    results = pathlib.Path(results_dir) if results_dir else weights
    result = {"export": str(path), "beam_size": config.beam_size,
              "length_penalty": config.length_penalty, "validation": None,
              "test": None}
    roles = ["validation"] + (["test"] if test else [])
    if test and not manifest["splits"].get("test"):
        raise ValueError(f"the prepared folder {str(prepared)!r} has no test split")
    for role in roles:
        result[role] = _score_split(role, path, prepared, manifest, config,
                                    limit, batch_size, results)
    write_json(results / "export_result.json", result)
    return result


def _check_weights_model(weights, prepared, manifest):
    """Raises ``ValueError`` where ``weights.json`` names another model
    than the prepared folder's, or was trained on another prepared folder
    (its ``prepared_manifest_sha256`` is not the SHA-256 of ``prepared``'s
    ``manifest.json``: another vocabulary, ids or splits)."""
    info = _read_weights_info(weights) if (weights / WEIGHTS_MANIFEST).is_file() else None
    if info is not None and info.get("model") != manifest["model"]:
        raise ValueError(
            f"the weights in {str(weights)!r} are of the model {info.get('model')}, "
            f"the prepared folder {str(prepared)!r} of {manifest['model']}")
    recorded = info.get("prepared_manifest_sha256") if info is not None else None
    if recorded is not None:
        actual = sha256_file(prepared / MANIFEST)
        if recorded != actual:
            raise ValueError(
                f"the weights in {str(weights)!r} were trained on "
                f"{_trained_on(weights)} (manifest.json SHA-256 "
                f"{recorded[:16]}...), not on the prepared folder "
                f"{str(prepared)!r} (manifest.json SHA-256 {actual[:16]}...): "
                "its vocabulary and ids need not be theirs; export them with "
                "the prepared folder they were trained on")


def _trained_on(weights):
    """The prepared folder ``result.json`` beside the weights names, as
    words (``another prepared folder`` where it names none)."""
    try:
        folder = json.loads((weights / "result.json").read_text("utf-8"))["prepared"]
    except (OSError, ValueError, KeyError, TypeError):
        folder = None
    if isinstance(folder, str):
        return f"the prepared folder {folder!r}"
    return "another prepared folder"


def _export_config(manifest, beam_size):
    """The prepared config, its ``beam_size`` replaced where given."""
    config = prepared_config(manifest)
    if beam_size is not None:
        config = dataclasses.replace(config, beam_size=int(beam_size))
        if config.beam_size < 1:
            raise ValueError(f"`beam_size` must be >= 1, got beam_size={beam_size}")
    return config


def _export_saved_model(model, config, prepared, export_dir):
    """The translation job's raw-text SavedModel of ``model`` with the
    prepared folder's tokenizer (in a TensorFlow child process off the
    TensorFlow backend); returns its path."""
    tokenizer = job.prepare_tokenizer(config, [], prepared)
    val_src = read_lines(prepared / TEXT_FILES["validation"][0])
    if keras.backend.backend() == "tensorflow":
        translator = Translator(model, tokenizer, **job._search_options(config))
        return job.export_translation(translator, config, export_dir, val_src)
    return job.export_translation_in_tensorflow(model, config, prepared,
                                                export_dir, val_src)


def _score_split(role, path, prepared, manifest, config, limit, batch_size, results):
    """Decodes the ``role`` split (``validation`` or ``test``) with the
    SavedModel at ``path``, writes the hypotheses to ``results`` and
    returns its entry of ``export_portable``'s result (sacreBLEU; for the
    test split also the tokenized BLEU with compound splitting)."""
    src_name, tgt_name = TEXT_FILES[role]
    sources = read_lines(prepared / src_name)
    references = read_lines(prepared / tgt_name)
    if limit:
        sources, references = sources[:limit], references[:limit]
    start = time.time()
    hyps = translate_with_saved_model(path, sources, batch_size)
    seconds = time.time() - start
    bleu, signature, line = corpus_bleu(hyps, references)
    name = manifest["splits"][role]["name"]
    entry = {"split": name, "sentences": len(sources), "bleu": round(bleu, 2),
             "bleu_line": line, "signature": signature,
             "seconds": round(seconds, 1),
             "hypotheses": f"{name}.hyp.{config.target_language}"}
    if role == "test":
        tok_bleu, tok_line = compound_split_bleu(hyps, references,
                                                 config.target_language)
        entry.update(tokenized_compound_split_bleu=round(tok_bleu, 2),
                     tokenized_compound_split_bleu_line=tok_line)
    _write_lines(results / entry["hypotheses"], hyps)
    search = "greedy" if config.beam_size == 1 else f"beam {config.beam_size}"
    print(f"{name} ({search}, SavedModel): {line}\nsacreBLEU signature: "
          f"{signature}", flush=True)
    return entry


def export_main(argv=None, prog="keras-trm export-portable"):
    """``keras-trm export-portable``'s flags (argparse); runs
    ``export_portable``. A missing or damaged folder exits with status 2
    and one line naming it."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Turn weights trained by `keras-trm train-portable` into "
        "the usual raw-text SavedModel (export/<model>/<version>/) and report "
        "sacreBLEU on val (and test) decoded with it. Needs TensorFlow.")
    parser.add_argument("--prepared", required=True,
                        help="the folder `keras-trm prepare-translation` wrote")
    parser.add_argument("--weights", required=True,
                        help="the weights folder `keras-trm train-portable` wrote "
                        "(<workdir>/weights)")
    parser.add_argument("--export_dir", "--export-dir", default="export",
                        help="SavedModels go to <export_dir>/<model>/<version>/")
    parser.add_argument("--test", action="store_true",
                        help="also decode the test split (the final figure)")
    parser.add_argument("--beam_size", "--beam-size", type=int, default=None,
                        help="beam width (1: greedy; default: the prepared config's)")
    parser.add_argument("--limit", type=int, default=0,
                        help="> 0: decode only the first n sentences of each split")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=100,
                        help="sentences per SavedModel call")
    parser.add_argument("--results_dir", "--results-dir", default=None,
                        help="where export_result.json and the hypotheses go "
                        "(default: --weights)")
    args = parser.parse_args(argv)
    if args.beam_size is not None and args.beam_size < 1:
        parser.error(f"--beam_size must be >= 1, got {args.beam_size}")
    if args.limit < 0 or args.batch_size < 1:
        parser.error(f"--limit must be >= 0 and --batch_size >= 1, got "
                     f"{args.limit} and {args.batch_size}")
    try:
        read_prepared(args.prepared, verify=False)
        if not (pathlib.Path(args.weights) / WEIGHTS_MANIFEST).is_file():
            raise FileNotFoundError(
                f"--weights {args.weights!r} has no {WEIGHTS_MANIFEST}: pass the "
                "weights folder of `keras-trm train-portable` (<workdir>/weights)")
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    try:
        result = export_portable(args.prepared, args.weights, args.export_dir,
                                 test=args.test, beam_size=args.beam_size,
                                 limit=args.limit, batch_size=args.batch_size,
                                 results_dir=args.results_dir)
    except (FileNotFoundError, ValueError) as err:  # damaged files, other model
        parser.error(str(err))
    print(json.dumps({"export": result["export"], **{
        role: None if result[role] is None else result[role]["bleu"]
        for role in ("validation", "test")}}, indent=1))
    return 0


if __name__ == "__main__":  # python -m keras_trm.jobs.portable_tensorflow ARGS
    sys.exit(export_main())
