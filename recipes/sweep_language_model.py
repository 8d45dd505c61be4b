"""Recipe: choose the language-model recipe on valid only (issue #63).

    python recipes/sweep_language_model.py --corpus ptb --trials 12 \
        --minutes 60 --root runs/lm_sweep --out recipes/sweeps/ptb_search.json

An Optuna study (TPE sampler, seeded) over the Transformer-XL recipe's
size, segment and memory lengths, dropouts, weight decay and peak learning
rate. Each trial is the language-model job (``keras_trm.jobs.language_model``)
run in this process up to the end of its ``fit`` stage, Transformer-XL
only, within ``--minutes`` of training (the job's fitted schedule:
``time_budget_minutes``): the trial's value is its last validation
perplexity (with memory), so no trial reads the test split. The test split
is scored once per final configuration by ``recipes/language_model.py``
with the chosen flags, which also trains the vanilla baseline with the
same parameters, tokens and schedule.

The study lives in ``<root>/study.db`` (SQLite): an interrupted sweep
goes on where it stopped (a trial cut by the interruption is run again).
After each trial every finished trial (flags, valid perplexity, steps,
training minutes, host) is written to ``--out`` (JSON), and the last line
printed is the command of the best trial so far.
"""

import argparse
import json
import math
import pathlib
import sys
import time

import keras

from keras_trm._optional import require_extra
from keras_trm.cli import config_keys
from keras_trm.data import resolve_data_dir
from keras_trm.decoding import evaluate_with_memory
from keras_trm.jobs.language_model import (
    LanguageModelConfig,
    LanguageModelRun,
    float32_lm,
)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from sweep_multi30k import host  # noqa: E402  (the recipes' host record)

require_extra("tune", ["optuna"], "recipes/sweep_language_model.py")
import optuna  # noqa: E402


def suggest(trial):
    """The search space: ``LanguageModelConfig`` fields (heads of width 64,
    ``d_ff`` 4 ``d_model``, memory as long as the segment)."""
    d_model = trial.suggest_categorical("d_model", [128, 256, 384])
    seg_len = trial.suggest_categorical("seg_len", [32, 64, 96])
    return dict(
        num_layers=trial.suggest_int("num_layers", 2, 6),
        d_model=d_model, num_heads=d_model // 64, d_ff=4 * d_model,
        seg_len=seg_len, mem_len=seg_len,
        dropout_rate=round(trial.suggest_float("dropout_rate", 0.1, 0.5, step=0.05), 2),
        attention_dropout_rate=round(trial.suggest_float(
            "attention_dropout_rate", 0.0, 0.2, step=0.05), 2),
        weight_decay=trial.suggest_categorical("weight_decay", [0.0, 0.01, 0.1]),
        learning_rate=float(f'{trial.suggest_float("learning_rate", 2.5e-4, 2e-3, log=True):.3g}'),
    )


class ValidOnly(LanguageModelRun):
    """The job up to ``fit``, then valid perplexity with each memory length
    of ``EVAL_MEM_FACTORS`` x ``mem_len`` (Transformer-XL's relative
    positions let a longer memory serve at evaluation, Dai et al. 2019
    §4.2): the trial's best, and its ``eval_mem_len``, are the result."""

    STAGES = ("prepare_data", "build", "fit", "score")
    EVAL_MEM_FACTORS = (1, 2, 4)

    def score(self):
        config = self.config
        xl = float32_lm(self.xl)
        valid = {}
        for factor in self.EVAL_MEM_FACTORS:
            xl.set_mem_len(factor * config.mem_len)
            valid[factor * config.mem_len] = round(math.exp(
                evaluate_with_memory(xl, self.valid, config.seg_len)), 3)
        eval_mem_len = min(valid, key=valid.get)
        self.result = {
            "valid_perplexity": valid[eval_mem_len], "eval_mem_len": eval_mem_len,
            "valid_perplexity_by_eval_mem_len": valid,
            "valid_history_nll": self.xl_history["valid_nll"],
            "steps": self.steps, "train_minutes": round(self.xl_train_s / 60, 2),
            "parameters": self.xl_params,
        }


def flags(config_fields):
    """``--model.d_model 256 ...``: the flags as ``--help`` spells them."""
    keys = config_keys(LanguageModelConfig)
    return " ".join(f"--{keys[name]} {value}" for name, value in config_fields.items())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="ptb", choices=["ptb", "tinyshakespeare"])
    parser.add_argument("--trials", type=int, default=12,
                        help="trials to reach in the study (finished ones count)")
    parser.add_argument("--minutes", type=float, default=60.0,
                        help="training minutes of each trial (the recipe's budget)")
    parser.add_argument("--precision", default="auto",
                        help="training precision of each trial (see keras-trm train-lm)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the sampler's and every trial's seed")
    parser.add_argument("--root", default="runs/lm_sweep",
                        help="folder of the study and the trials' work folders")
    parser.add_argument("--out", default="recipes/sweeps/ptb_search.json")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--train_tokens", type=int, default=0,
                        help="> 0: only the first n training tokens (a smoke run)")
    parser.add_argument("--eval_tokens", type=int, default=0,
                        help="> 0: only the first n validation tokens (a smoke run)")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data_dir(args.data_dir)
    study = optuna.create_study(
        study_name=f"{args.corpus}_{args.minutes:g}min", direction="minimize",
        storage=f"sqlite:///{root / 'study.db'}", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=args.seed))

    def objective(trial):
        keras.backend.clear_session()
        fields = dict(suggest(trial), corpus=args.corpus, baseline=False,
                      steps=100_000, time_budget_minutes=args.minutes,
                      precision=args.precision, warmup_steps=400,
                      eval_every=500, seed=args.seed,
                      train_tokens=args.train_tokens, eval_tokens=args.eval_tokens)
        workdir = root / f"trial_{trial.number}"
        result = ValidOnly(LanguageModelConfig(**fields), data_dir, workdir,
                           workdir / "export", None, 2, None).run()
        for key, value in result.items():
            if key != "valid_perplexity":
                trial.set_user_attr(key, value)
        trial.set_user_attr("config", dict(fields, eval_mem_len=result["eval_mem_len"]))
        return result["valid_perplexity"]

    def record(study, trial):
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        best = min(done, key=lambda t: t.value)
        report = {
            "command": "python recipes/sweep_language_model.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "split": "valid (the test split is not read)",
            "minutes_per_trial": args.minutes,
            "host": host(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "best": {"number": best.number, "valid_perplexity": best.value,
                     "config": best.user_attrs["config"]},
            "trials": [{"number": t.number, "valid_perplexity": t.value,
                        **t.user_attrs} for t in done],
        }
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        config = {k: v for k, v in best.user_attrs["config"].items()
                  if k not in ("baseline", "steps", "eval_every", "train_tokens",
                               "eval_tokens")}
        print(f"best so far (trial {best.number}, valid perplexity {best.value}): "
              f"python recipes/language_model.py {flags(config)}", flush=True)

    left = args.trials - len([t for t in study.trials
                              if t.state == optuna.trial.TrialState.COMPLETE])
    if left > 0:
        study.optimize(objective, n_trials=left, callbacks=[record])
    return 0


if __name__ == "__main__":
    sys.exit(main())
