"""IMDB sentiment: WordPiece in the graph, three classifiers, full test set.

Used by ``recipes/imdb.py``. The job learns a lowercase WordPiece
vocabulary from 90% of the 25,000 training reviews (the rest: a seeded
validation split); trains in turn the BERT-style ``encoder_classifier`` and
the ``lstm_classifier`` with ``LSTM_LN`` (Ba et al. 2016, §3.1) and with
``keras.layers.LSTM`` (its baseline), on the same ids, batches and
schedule; scores the 25,000 test reviews once with each model's best
validation epoch; writes ``<workdir>/<kind>.json`` and the report; and
exports ``<export_dir>/imdb_<kind>/<version>/``, whose ``serving_default``
takes raw review strings and returns ``{"probabilities": float32 (batch,
2)}`` (column 1 = positive).

Preprocessing, the same in training and in the export (``ReviewClassifier``):
``tf.strings.lower`` (UTF-8) -> WordPiece ids -> reviews longer than
``max_length`` tokens keep their first ``max_length // 4`` and last
``max_length - max_length // 4`` tokens (head + tail truncation, the best
scheme of Sun et al. 2019, "How to Fine-Tune BERT for Text
Classification?", §5.3.1) -> right padding with id 0 (an empty review is
all padding, which every classifier maps to defined probabilities).
"""

import dataclasses
import json
import os
import pathlib
import time
from typing import Literal, get_args

import keras
import numpy as np

from keras_trm.data import check_labels, load_imdb, validation_split
from keras_trm.data.batching import labelled_bucket_batches, labelled_bucket_steps
from keras_trm.export import ReviewClassifier, export_module
from keras_trm.jobs._setup import check_choices, start_classifier_job
from keras_trm.jobs.stages import StagedJob
from keras_trm.models import text_classifier
from keras_trm.text import (TextTokenizer, encode_lowercase, learn_vocabulary,
                            load_vocabulary, lowercase, truncate_head_tail)
from keras_trm.training import (StepLog, compile_classifier, describe_fit,
                                fit_summary, restore_best_epoch)
from keras_trm.training import plots
from keras_trm.utils import atomic_write, checks as v, write_json

ModelKind = Literal["encoder", "lstm_ln", "lstm"]
OnOffAuto = Literal["auto", "on", "off"]
MODEL_KINDS = get_args(ModelKind)
LABELS = {"encoder": "Transformer encoder", "lstm_ln": "LSTM_LN",
          "lstm": "LSTM"}


@dataclasses.dataclass
class ImdbConfig:
    """Hyper-parameters of the IMDB recipe (defaults: the CPU run that
    ``docs/results/imdb/report.md`` reports)."""

    models: tuple[ModelKind, ...] = MODEL_KINDS
    """Classifiers to train, in order (comma-separated list)."""
    vocabulary_size: int = 16000
    """Lowercase WordPiece vocabulary size (tokens)."""
    max_length: int = 320
    """Tokens kept per review by the LSTM classifiers (tokens; head + tail truncation)."""
    batch_size: int = 64
    """Training batch size (reviews)."""
    # BERT-style encoder.
    encoder_max_length: int = 512
    """Tokens kept per review by the Transformer encoder (tokens)."""
    # Chosen on the validation split: 90.64% vs 90.28% for d_model 64 / 2
    # heads / d_ff 128, 89.96% with 2 blocks or 3 epochs, 89.88% / 90.32%
    # with dropout 0.3 / 0.1.
    num_layers: int = 1
    """Encoder blocks."""
    d_model: int = 128
    """Encoder width (units)."""
    num_heads: int = 4
    """Encoder attention heads (divides d_model)."""
    d_ff: int = 256
    """Encoder feed-forward inner width (units)."""
    encoder_dropout_rate: float = 0.2
    """Encoder dropout rate (fraction, 0-1)."""
    encoder_epochs: int = 2
    """Encoder training epochs."""
    encoder_learning_rate: float = 1e-3
    """Encoder peak learning rate (Adam)."""
    # LSTM / LSTM_LN classifiers.
    embedding_dim: int = 64
    """LSTM token embedding width (units)."""
    units: int = 128
    """LSTM state width (units)."""
    lstm_dropout_rate: float = 0.3
    """Dropout on the LSTM's final state (fraction, 0-1)."""
    # 2 (validation split): LSTM_LN 89.56% vs 88.80% at best of 4 epochs.
    lstm_epochs: int = 2
    """LSTM and LSTM_LN training epochs."""
    lstm_learning_rate: float = 2e-3
    """LSTM and LSTM_LN peak learning rate (Adam)."""
    # All models: Adam with linear warm-up then cosine decay to 0.
    warmup_steps: int = 100
    """Linear warm-up before the cosine decay to 0 (steps; at most 10% of the run)."""
    clipnorm: float = 1.0
    """Gradient clipping by norm (Adam's clipnorm)."""
    validation_fraction: float = 0.1
    """Share of the 25,000 training reviews held out for validation (fraction, seeded)."""
    limit: int = 0
    """> 0: a random n reviews of each split, for smoke runs (reviews; 0 = all)."""
    print_every: int = 50
    """Training steps between progress lines (steps)."""
    jit_compile: OnOffAuto = "auto"
    """XLA: ``on``, ``off`` or ``auto`` (on for the LSTMs, off for the
    encoder: the faster choice measured on CPU)."""
    seed: int = 0
    """Random seed (split, initialization, data order)."""
    download: bool = True
    """Fetch data missing from the data folder (online)."""

    # The sections of the command line and YAML (``--model.d_model``); the
    # flat ``--d_model`` works too.
    SECTIONS = {
        "data": ("vocabulary_size", "max_length", "encoder_max_length",
                 "validation_fraction", "limit", "download"),
        "model": ("num_layers", "d_model", "num_heads", "d_ff",
                  "encoder_dropout_rate", "embedding_dim", "units",
                  "lstm_dropout_rate"),
        "training": ("batch_size", "encoder_epochs", "encoder_learning_rate",
                     "lstm_epochs", "lstm_learning_rate", "warmup_steps",
                     "clipnorm", "print_every", "jit_compile"),
    }

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value (``keras-trm train-imdb`` makes it a usage error, exit 2):
        also ``models`` empty or not a tuple or list, a ``jit_compile`` not
        one of ``auto``, ``on``, ``off`` and a ``download`` not a bool."""
        check_choices("models", self.models, set(MODEL_KINDS))
        v.one_of("jit_compile", self.jit_compile, get_args(OnOffAuto))
        v.boolean("download", self.download)
        for name in ("vocabulary_size", "max_length", "batch_size",
                     "encoder_max_length", "num_layers", "d_model", "num_heads",
                     "d_ff", "encoder_epochs", "embedding_dim", "units",
                     "lstm_epochs", "warmup_steps", "print_every"):
            v.positive_int(name, getattr(self, name))
        for name in ("limit", "seed"):
            v.non_negative_int(name, getattr(self, name))
        v.divisible("d_model", self.d_model, "num_heads", self.num_heads)
        for name in ("encoder_dropout_rate", "lstm_dropout_rate"):
            v.rate(name, getattr(self, name))
        for name in ("encoder_learning_rate", "lstm_learning_rate", "clipnorm"):
            v.positive_float(name, getattr(self, name))
        v.fraction("validation_fraction", self.validation_fraction)
        return self


def prepare_vocabulary(config, texts, workdir):
    """Loads ``<workdir>/vocab_lower_<size>_train<n>.txt`` (learned from the
    ``n`` training reviews ``texts``) or learns and writes it."""
    path = (pathlib.Path(workdir)
            / f"vocab_lower_{config.vocabulary_size}_train{len(texts)}.txt")
    if path.is_file():
        return load_vocabulary(path)
    print(f"learning a lowercase WordPiece vocabulary ({config.vocabulary_size}"
          f") from {len(texts):,} reviews ...", flush=True)
    return learn_vocabulary(lowercase(texts), config.vocabulary_size, path)


def model_max_length(kind, config):
    """Tokens kept per review for ``kind`` (``[encoder_]max_length``)."""
    return config.encoder_max_length if kind == "encoder" else config.max_length


def classifier_options(kind, config):
    """``config``'s keyword arguments of ``keras_trm.models.text_classifier``
    for ``kind`` (the model is named ``imdb_<kind>``, its export folder)."""
    v.one_of("kind", kind, set(MODEL_KINDS))
    return dict(
        max_sequence_length=config.encoder_max_length,
        num_layers=config.num_layers,
        d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
        embedding_dim=config.embedding_dim, units=config.units,
        dropout_rate=(config.encoder_dropout_rate if kind == "encoder"
                      else config.lstm_dropout_rate),
        name=f"imdb_{kind}")


def compile_options(kind, config, total_steps):
    """``config``'s keyword arguments of ``compile_classifier`` for ``kind``:
    its learning rate, a warm-up of at most a tenth of ``total_steps``, and
    with ``jit_compile="auto"`` XLA for the LSTMs only (on this CPU XLA ran
    the LSTM steps ~1.7x faster and the encoder ~15% slower)."""
    return dict(
        learning_rate=(config.encoder_learning_rate if kind == "encoder"
                       else config.lstm_learning_rate),
        total_steps=total_steps,
        warmup_steps=min(config.warmup_steps, max(total_steps // 10, 1)),
        clipnorm=config.clipnorm,
        jit_compile={"on": True, "off": False}.get(config.jit_compile,
                                                   kind != "encoder"))


def fit_and_test(model, train, validation, test, epochs, log, verbose,
                 fit_options=None, test_options=None):
    """``model.fit(*train)`` keeping the weights of the best ``validation``
    epoch, then ``model.evaluate(*test)`` once with them; returns
    ``(fit_summary dict, training seconds, test seconds)``."""
    best = restore_best_epoch()
    start = time.time()
    model.fit(*train, epochs=epochs, validation_data=validation,
              callbacks=[log, best], verbose=verbose, **(fit_options or {}))
    middle = time.time()
    scores = model.evaluate(*test, return_dict=True, verbose=verbose,
                            **(test_options or {}))
    return fit_summary(log, best, scores), middle - start, time.time() - middle


def train_and_evaluate(kind, config, train, validation, test,
                       vocabulary_size, verbose=2):
    """Trains one classifier on ``train``, keeps the epoch with the best
    accuracy on ``validation`` and scores ``test`` once with it; returns
    ``(model, result dict)``. Each split: ``(ragged ids, int32 labels)``, the
    ids before truncation to ``model_max_length``."""
    keras.utils.set_random_seed(config.seed)
    max_length = model_max_length(kind, config)
    train, validation, test = [(truncate_head_tail(ids, max_length), labels)
                               for ids, labels in (train, validation, test)]
    steps = labelled_bucket_steps(train[0].row_lengths().numpy(),
                                  config.batch_size, max_length)
    epochs = config.encoder_epochs if kind == "encoder" else config.lstm_epochs
    model = text_classifier(kind, vocabulary_size,
                            **classifier_options(kind, config))
    compile_classifier(model, **compile_options(kind, config, steps * epochs))
    print(f"{kind}: {model.count_params():,} parameters, {epochs} epochs of "
          f"{steps} steps", flush=True)
    summary, train_seconds, test_seconds = fit_and_test(
        model, [labelled_bucket_batches(*train, config.batch_size, max_length,
                                        shuffle=True, drop_remainder=True,
                                        seed=config.seed)],
        labelled_bucket_batches(*validation, 256, max_length),
        [labelled_bucket_batches(*test, 256, max_length)], epochs,
        StepLog(print_every=config.print_every, total=steps * epochs), verbose)
    examples = steps * config.batch_size * epochs
    result = {
        "model": kind, "label": LABELS[kind], "parameters": int(model.count_params()),
        "epochs": epochs, "max_length": max_length, "batch_size": config.batch_size,
        "train_examples": examples, "train_minutes": round(train_seconds / 60, 2),
        "train_examples_per_second": round(examples / train_seconds, 1),
        "validation_examples": int(len(validation[1])), "test_examples": int(len(test[1])),
        "test_eval_minutes": round(test_seconds / 60, 2), **summary}
    print(describe_fit(kind, result, epochs)
          + f" on {result['test_examples']:,} reviews "
          f"({result['train_minutes']:.1f} min of training)", flush=True)
    return model, result


# --- report (the MNIST job shares its helpers) ------------------------------


def first_and_last_epoch(result):
    """The per-step training losses of a run's first and last epochs."""
    loss = np.asarray(result["step_loss"])
    per_epoch = len(loss) // result["epochs"]
    return loss[:per_epoch], loss[-per_epoch:]


def plot_curves(path, runs, title, x_label, smooth_window, examples_per_step=1):
    """``plot_runs`` of the runs' per-step training loss (x: steps times
    ``examples_per_step``) and validation accuracy; False, saying so, when
    matplotlib is not installed."""
    if not plots.available():
        print('no plot: matplotlib is not installed (pip install "keras_trm[plots]")')
        return False
    runs = [{"label": r["label"], "loss": r["step_loss"], "epochs": r["epoch_log"],
             "loss_x": np.arange(1, len(r["step_loss"]) + 1) * examples_per_step}
            for r in runs]
    plots.plot_runs(path, runs, title, x_label, "val_accuracy",
                    "validation accuracy (%)", smooth_window=smooth_window)
    return True


def _lstm_comparison(results):
    """Plain sentences comparing the LSTM and LSTM_LN curves."""
    a, b = results.get("lstm"), results.get("lstm_ln")
    if not (a and b):
        return []
    lines, firsts = [], []
    for r in (b, a):
        first, last = first_and_last_epoch(r)
        firsts.append(first)
        lines.append(
            f"- {r['label']}: mean training loss over epoch 1 "
            f"{first.mean():.3f}, over the last epoch "
            f"{last.mean():.3f}; step-to-step spread (std of the "
            f"loss minus its 50-step moving average) in epoch 1 "
            f"{_roughness(first):.3f}; validation accuracy by epoch "
            + ", ".join(f"{100 * e['val_accuracy']:.1f}%" for e in r["epoch_log"])
            + f" (epoch {r['best_epoch']} kept); full test "
            f"{100 * r['test_accuracy']:.2f}%."
        )
    ln_rough, plain_rough = map(_roughness, firsts)
    ln_mean, plain_mean = (f.mean() for f in firsts)
    steadier, faster = ln_rough < plain_rough, ln_mean < plain_mean
    lines.append(
        f"- Against the commonly stated result (\"LN steadies the LSTM\"): "
        f"in epoch 1 LSTM_LN's loss is {'less' if steadier else 'not less'} "
        f"noisy from step to step ({ln_rough:.3f} vs {plain_rough:.3f}) and "
        f"its mean is {'lower' if faster else 'not lower'} ({ln_mean:.3f} vs "
        f"{plain_mean:.3f}); this "
        f"{'matches' if steadier and faster else 'does not fully match'} it. "
        f"Final full-test accuracy: LSTM_LN {100 * b['test_accuracy']:.2f}% vs "
        f"LSTM {100 * a['test_accuracy']:.2f}% (one seed each).")
    return lines


def _roughness(loss, window=50):
    loss = np.asarray(loss, dtype=np.float64)
    return float(np.std(loss - plots.smooth(loss, window)))


def markdown_table(header, rows):
    """The lines of a Markdown table: ``header``, then ``rows`` (cells)."""
    return ["| " + " | ".join(map(str, cells)) + " |"
            for cells in (header, ["---"] * len(header), *rows)]


def _results_table(results):
    """The report's table: one row per model, in ``MODEL_KINDS`` order."""
    return markdown_table(
        ["model", "parameters", "max_length", "epochs", "train min",
         "train examples/s", "best validation accuracy [epoch]", "test accuracy",
         "test reviews", "test loss"],
        [[r["label"], f"{r['parameters']:,}", r["max_length"], r["epochs"],
          f"{r['train_minutes']:.1f}", f"{r['train_examples_per_second']:.0f}",
          f"{100 * r['validation_accuracy']:.2f}% [{r['best_epoch']}]",
          f"**{100 * r['test_accuracy']:.2f}%**", f"{r['test_examples']:,}",
          f"{r['test_loss']:.4f}"] for r in results.values()])


def _setup_lines(results):
    """One line per model: its hyper-parameters, from its JSON."""
    lines = []
    for kind, r in results.items():
        c = r["config"]
        if kind == "encoder":
            detail = (f"{c['num_layers']} block(s), d_model {c['d_model']}, "
                      f"{c['num_heads']} heads, d_ff {c['d_ff']}, mean "
                      f"pooling, dropout {c['encoder_dropout_rate']}, peak "
                      f"lr {c['encoder_learning_rate']}")
        else:
            detail = (f"embedding {c['embedding_dim']}, {c['units']} units, "
                      f"dropout {c['lstm_dropout_rate']} on the final state, "
                      f"peak lr {c['lstm_learning_rate']}")
        lines.append(f"- {LABELS[kind]}: {detail}; batch {c['batch_size']}, "
                     f"warm-up {c['warmup_steps']} steps, clipnorm "
                     f"{c['clipnorm']}, vocabulary {c['vocabulary_size']} asked.")
    return lines


def write_report(workdir, results_dir, config, extra=None):
    """Writes ``report.md``, the plot and the per-model JSON files to
    ``results_dir`` from the ``<kind>.json`` files in ``workdir``; returns
    the path of ``report.md``."""
    results_dir = pathlib.Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: pathlib.Path(workdir) / f"{kind}.json" for kind in MODEL_KINDS}
    results = {kind: json.loads(path.read_text())
               for kind, path in paths.items() if path.is_file()}
    for kind, r in results.items():
        write_json(results_dir / f"{kind}.json", r)
    if "lstm" in results and "lstm_ln" in results:
        plot_curves(results_dir / "imdb_lstm_vs_lstm_ln.png",
                    [results["lstm"], results["lstm_ln"]],
                    f"IMDB: LSTM vs LSTM_LN (units {config.units}, batch "
                    f"{config.batch_size}, same data order and schedule)",
                    "training step", smooth_window=25)
    text = [
        "# IMDB sentiment: Transformer encoder, LSTM_LN and LSTM",
        "",
        "Produced by `python recipes/imdb.py` (`keras_trm.jobs.imdb`). The "
        "models train on 90% of the training reviews; the other 10% (a "
        "seeded split) are the validation set, scored after every epoch (the "
        "per-epoch accuracies in the JSON files and the plot). The weights "
        "of the best validation epoch are kept and scored once on the whole "
        "test set (25,000 reviews unless `--limit` was used), which is used "
        "for nothing else.",
        "",
        *_results_table(results),
        "",
        "Setup: lowercase WordPiece vocabulary learned from the training "
        "reviews (in-graph tokenization), head+tail truncation to "
        "`max_length` tokens, length-bucketed batches, Adam with warm-up and "
        "cosine decay to 0, gradient clipping. Per model (from its JSON):",
        "",
        *_setup_lines(results),
        "",
    ]
    if extra:
        text += [extra, ""]
    lines = _lstm_comparison(results)
    if lines:
        text += ["## LSTM vs LSTM_LN", "",
                 "![LSTM vs LSTM_LN](imdb_lstm_vs_lstm_ln.png)", "", *lines, ""]
    text += ["Files: " + ", ".join(f"`{k}.json`" for k in results)
             + " (per-step training loss `step_loss`, per-epoch "
             "`epoch_log`, final figures, configuration).", ""]
    atomic_write(results_dir / "report.md", "\n".join(text))
    return results_dir / "report.md"


# --- the job ------------------------------------------------------------------


class ClassifierJob(StagedJob):
    """What the IMDB and MNIST jobs share (a subclass sets ``CONFIG``, its
    config class, ``NAME``, ``RECIPE`` and ``write_report``)."""

    def __init__(self, config, data_dir, workdir, export_dir, results_dir, verbose):
        self.config = config = (config or self.CONFIG()).validate()
        start_classifier_job(self, workdir, data_dir, export_dir, results_dir,
                             verbose, config.download)
        self.results = {}

    def _keep(self, name, result, wrapper, export_name, assets=None):
        """Exports ``wrapper`` (its ``classify`` is ``serving_default``; the
        config is the asset ``config.json``) and writes ``<name>.json``."""
        result["config"] = dataclasses.asdict(self.config)
        path = export_module(
            wrapper, self.export_dir, export_name,
            signatures={"serving_default": wrapper.classify},
            assets={**(assets or {}),
                    "config.json": json.dumps(result["config"], indent=1)})
        print(f"exported SavedModel to {path}", flush=True)
        result["export"] = str(path)
        write_json(self.workdir / f"{name}.json", result)
        self.results[name] = result

    def report(self, detail=""):
        """The job's wall time; the report in ``results_dir`` unless ``""``."""
        job_minutes = (time.time() - self.job_start) / 60
        print(f"{self.NAME} job: {job_minutes:.1f} min", flush=True)
        if self.results_dir:
            report = self.write_report(
                self.workdir, self.results_dir, self.config,
                extra=f"Wall time of the last `recipes/{self.RECIPE}.py` "
                      f"call{detail}: {job_minutes:.1f} min on "
                      f"{len(os.sched_getaffinity(0))} CPU core(s) available "
                      "to the process.")
            print(f"report: {report}", flush=True)
        self.result = dict(self.results)


def run(config=None, data_dir=None, workdir="runs/imdb", export_dir="export",
        results_dir=None, verbose=None):
    """Runs the whole job; returns ``{kind: result dict}`` of the models
    trained in this call (results of earlier calls in ``workdir`` are kept
    and enter the report), plus ``"stage_seconds"`` (wall seconds per stage
    of ``ImdbRun``). The report goes to ``results_dir`` (None:
    ``<workdir>/results``; ``""``: no report)."""
    return ImdbRun(config, data_dir, workdir, export_dir, results_dir, verbose).run()


def _subset(texts, labels, index):
    return [texts[i] for i in index], labels[index]


class ImdbRun(ClassifierJob):
    """The IMDB job's stages (``keras_trm.jobs.stages``): ``prepare_data``
    (load, ``limit``, validation split) -> ``tokenize`` (vocabulary, ids) ->
    ``fit_evaluate_export`` (each model kind in turn: ``train_and_evaluate``,
    its SavedModel, ``<kind>.json``) -> ``report``."""

    STAGES = ("prepare_data", "tokenize", "fit_evaluate_export", "report")
    CONFIG, NAME, RECIPE = ImdbConfig, "IMDB", "imdb"
    write_report = staticmethod(write_report)

    def prepare_data(self):
        """Both splits (a seeded ``limit`` of each for smoke runs), and the
        seeded validation split held out of the training reviews."""
        config = self.config
        splits = {}
        for split in ("train", "test"):
            texts, labels = load_imdb(split, self.data_dir, download=config.download)
            splits[split] = texts, check_labels(labels, 2, f"{split}_labels")
            if config.limit:
                # Each split sampled by its own size (a copy may hold fewer
                # than 25,000 reviews).
                keep = np.random.default_rng(config.seed).permutation(
                    len(labels))[:config.limit]
                splits[split] = _subset(*splits[split], keep)
        if config.limit:
            print(f"smoke run: {config.limit} reviews of each split", flush=True)
        train = splits["train"]
        self.test_texts, self.test_labels = splits["test"]
        train_index, val_index = validation_split(
            len(train[1]), config.validation_fraction, config.seed)
        self.train_texts, self.train_labels = _subset(*train, train_index)
        self.val_texts, self.val_labels = _subset(*train, val_index)
        print(f"{len(self.train_texts):,} training / {len(self.val_texts):,} "
              f"validation reviews (seeded split of the training set), "
              f"{len(self.test_texts):,} test reviews (scored once per model, "
              "after training)", flush=True)

    def tokenize(self):
        """The WordPiece vocabulary (learned from the training reviews, or
        loaded) and the ids of the three splits, before truncation."""
        config = self.config
        t0 = time.time()
        self.vocab = vocab = prepare_vocabulary(config, self.train_texts, self.workdir)
        vocab_seconds = time.time() - t0
        tokenizer = TextTokenizer(vocab)
        t0 = time.time()
        splits = (self.train_texts, self.val_texts, self.test_texts)
        self.train_ids, self.val_ids, self.test_ids = (
            encode_lowercase(tokenizer, texts) for texts in splits)
        full = self.train_ids.row_lengths().numpy()
        reviews = sum(map(len, splits))
        print(f"vocabulary {len(vocab):,} ({vocab_seconds:.0f} s); tokenized "
              f"{reviews:,} reviews in {time.time() - t0:.0f} s; train reviews: "
              f"median {np.median(full):.0f} tokens, "
              f"{100 * np.mean(full > config.max_length):.0f}% longer than "
              f"{config.max_length}, "
              f"{100 * np.mean(full > config.encoder_max_length):.0f}% longer "
              f"than {config.encoder_max_length}", flush=True)

    def fit_evaluate_export(self):
        """Each kind of ``config.models`` in turn: trained, scored
        (``train_and_evaluate``), exported as a raw-text SavedModel
        (``ReviewClassifier``) and written to ``<workdir>/<kind>.json``
        before the next one starts."""
        for kind in self.config.models:
            model, result = train_and_evaluate(
                kind, self.config, (self.train_ids, self.train_labels),
                (self.val_ids, self.val_labels),
                (self.test_ids, self.test_labels), len(self.vocab),
                verbose=self.verbose)
            wrapper = ReviewClassifier(model, self.vocab,
                                       model_max_length(kind, self.config))
            self._keep(kind, result, wrapper, model.name,
                       {"vocab.txt": "\n".join(self.vocab) + "\n"})

    def report(self):
        super().report(f" (models {', '.join(self.config.models)})")
