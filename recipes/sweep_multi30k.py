"""Recipe: choose the Multi30k recipe on val only (issue #40).

    python recipes/sweep_multi30k.py --trials recipes/sweeps/multi30k.yaml \
        --root runs/sweep --out docs/results/multi30k_sweep.json

Each trial is ``keras-trm train-translation`` with the trial's flags, run
in a process of its own on ``--dataset files`` with Multi30k's train and
val files and *no test files*, so a trial never decodes
test_2016_flickr. After it, the averaged model (``<workdir>/model.keras``,
the checkpoint average the job chose on greedy val BLEU) decodes val once
per beam size and length penalty of ``--beam_sizes`` x
``--length_penalties``, in float32 as the job's test decoding does.

Every trial's flags, per-epoch greedy val BLEU, averaged val BLEU (greedy
and each beam setting: cased sacreBLEU, and the lower-cased figure that
Wu et al. (2021) report), training minutes and host go to ``--out`` (JSON),
which is rewritten after each trial; a trial already in it is skipped, so
an interrupted sweep goes on where it stopped. The test split is scored
afterwards, once per final configuration, by running
``keras-trm train-translation`` with the chosen flags (its default
dataset reports test_2016_flickr).

The trials file is YAML: a list of ``{name: str, flags: {flag: value}}``
(flag names as ``keras-trm train-translation --help`` lists them).
"""

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import yaml

from keras_trm.data import resolve_data_dir


def host():
    """The CPU model and what it supports (the figures depend on it)."""
    model, flags = platform.processor(), ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    features = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
                if f" {f} " in f" {flags} "]
    return {"cpu": model, "features": features, "cores": os.cpu_count()}


def train(trial, multi30k, root):
    """Runs one trial's training job; returns its workdir."""
    workdir = pathlib.Path(root) / trial["name"]
    flags = []
    for key, value in trial.get("flags", {}).items():
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool)
                  else str(value)]
    command = [
        sys.executable, "-m", "keras_trm.cli", "train-translation",
        "--dataset", "files",
        "--train_source", str(multi30k / "train.en.gz"),
        "--train_target", str(multi30k / "train.de.gz"),
        "--validation_source", str(multi30k / "val.en.gz"),
        "--validation_target", str(multi30k / "val.de.gz"),
        "--workdir", str(workdir), "--export_dir", str(workdir / "export"),
        "--tensorboard", "off", *flags]
    log = workdir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{trial['name']}] {' '.join(command[2:])}  (log: {log})", flush=True)
    with open(log, "a", encoding="utf-8") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)
    return workdir


def score_val(workdir, multi30k, beam_sizes, length_penalties):
    """Val sacreBLEU of the trial's averaged model for each beam setting."""
    import keras
    import sacrebleu

    from keras_trm.data import load_parallel
    from keras_trm.decoding import (GreedyBleu, Translator, corpus_bleu,
                                    search_strategy)
    from keras_trm.cli import read_run_config
    from keras_trm.jobs.translation import TranslationConfig, prepare_tokenizer

    config = read_run_config(workdir / "config.yaml", TranslationConfig)
    tokenizer = prepare_tokenizer(config, [], workdir)
    model = keras.saving.load_model(workdir / "model.keras")
    sources, references = load_parallel(multi30k / "val.en.gz",
                                        multi30k / "val.de.gz")
    model = GreedyBleu(model, tokenizer, [], []).float32_model(model)
    scores = {}
    for beam_size in beam_sizes:
        for length_penalty in (length_penalties if beam_size > 1 else [0.0]):
            start = time.perf_counter()
            translator = Translator(model, tokenizer,
                                    search=search_strategy(beam_size=beam_size,
                                                           length_penalty=length_penalty))
            hyps = translator.translate_texts(sources)
            bleu = corpus_bleu(hyps, references)[0]
            lower = sacrebleu.corpus_bleu(hyps, [references], lowercase=True).score
            key = f"beam{beam_size}_lp{length_penalty:g}".replace(".", "_")  # beam4_lp0_6
            scores[key] = {"bleu": round(bleu, 2), "lowercase_bleu": round(lower, 2),
                           "seconds": round(time.perf_counter() - start, 1)}
            print(f"  val {key}: {bleu:.2f} (lower-cased {lower:.2f})", flush=True)
    return scores


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", required=True, type=pathlib.Path,
                        help="YAML list of {name, flags}")
    parser.add_argument("--root", default="runs/sweep", type=pathlib.Path,
                        help="each trial's workdir is <root>/<name>")
    parser.add_argument("--out", required=True, type=pathlib.Path,
                        help="the sweep's JSON (rewritten after each trial)")
    parser.add_argument("--data_dir", default=None,
                        help="data folder (see keras_trm.data.resolve_data_dir)")
    parser.add_argument("--beam_sizes", default="4",
                        help="comma-separated beam sizes decoded on val")
    parser.add_argument("--length_penalties", default="0.6",
                        help="comma-separated GNMT alphas decoded on val")
    parser.add_argument("--only", default="",
                        help="comma-separated trial names to run (default all)")
    args = parser.parse_args(argv)
    trials = yaml.safe_load(args.trials.read_text())
    names = [t["name"] for t in trials]
    if len(set(names)) != len(names):
        parser.error(f"--trials: trial names must be unique, got {names}")
    only = {n for n in args.only.split(",") if n}
    if only - set(names):
        parser.error(f"--only: unknown trials {sorted(only - set(names))}")
    beam_sizes = [int(b) for b in args.beam_sizes.split(",")]
    penalties = [float(a) for a in args.length_penalties.split(",")]
    multi30k = resolve_data_dir(args.data_dir) / "multi30k"
    sweep = (json.loads(args.out.read_text()) if args.out.is_file()
             else {"split": "val (Multi30k, 1,014 pairs); test is never decoded",
                   "trials": []})
    done = {t["name"] for t in sweep["trials"]}
    for trial in trials:
        if trial["name"] in done or (only and trial["name"] not in only):
            continue
        workdir = train(trial, multi30k, args.root)
        result = json.loads((workdir / "result.json").read_text())
        epochs = json.loads((workdir / "epochs.json").read_text())
        sweep["trials"].append({
            "name": trial["name"], "flags": trial.get("flags", {}),
            "date": time.strftime("%Y-%m-%d"), "host": host(),
            "parameters": result.get("parameters"),
            "epochs": result.get("epochs"),
            "train_minutes": result.get("train_minutes"),
            "job_minutes": result.get("job_minutes"),
            "val_greedy_bleu_per_epoch": [e.get("val_greedy_bleu") for e in epochs],
            "averaged_checkpoints": result.get("averaged_checkpoints"),
            "val_greedy_bleu_by_average": result.get("val_greedy_bleu_by_average"),
            "val_averaged": score_val(workdir, multi30k, beam_sizes, penalties),
        })
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(sweep, indent=1) + "\n")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
