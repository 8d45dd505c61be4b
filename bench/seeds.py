"""One JSON of several seeds' runs of a recipe: each run's figures and,
per figure, the mean, sample standard deviation, lowest and highest.

    python bench/seeds.py --out docs/results/language_model_ptb_seeds.json \
        --key transformer_xl.test.perplexity --key steps --key job_minutes \
        --what "..." docs/results/language_model_ptb*/result.json

Each ``result.json`` is a job's (``keras-trm train-lm``,
``train-translation``); a key is a dotted path into it (a run without it
gets null and is left out of that figure's summary), and the summary sits
at the same path of the output. The seed is the run's ``config.seed``.
"""

import argparse
import json
import pathlib
import statistics


def lookup(result, key):
    """``result``'s value at the dotted ``key``, None where it has none."""
    for part in key.split("."):
        if not isinstance(result, dict) or part not in result:
            return None
        result = result[part]
    return result


def summarize(paths, keys, what=""):
    """The summary dict of the ``result.json`` files ``paths``."""
    runs = []
    for path in paths:
        result = json.loads(pathlib.Path(path).read_text())
        run = {"seed": lookup(result, "config.seed"), "source": str(path),
               "command": result.get("command"), "date": result.get("date")}
        run.update({key: lookup(result, key) for key in keys})
        runs.append(run)
    runs.sort(key=lambda run: (run["seed"] is None, run["seed"]))
    dates = [run["date"] for run in runs if run["date"]]
    summary = {"what": what, "date": max(dates) if dates else None,
               "runs": runs}
    for key in keys:
        values = [run[key] for run in runs if run[key] is not None]
        if values:
            *parents, name = key.split(".")
            node = summary
            for parent in parents:  # nested as in result.json
                node = node.setdefault(parent, {})
            node[name] = {
                "runs": len(values), "mean": round(statistics.mean(values), 4),
                "sample_std": round(statistics.stdev(values), 4)
                if len(values) > 1 else None,
                "min": min(values), "max": max(values)}
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="result.json files")
    parser.add_argument("--key", action="append", required=True,
                        help="a dotted path into result.json (repeat)")
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--what", default="", help="what the runs are")
    args = parser.parse_args(argv)
    summary = summarize(args.results, args.key, args.what)
    pathlib.Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({key: lookup(summary, key) for key in args.key}, indent=1))


if __name__ == "__main__":
    main()
