"""Recipe: IMDB sentiment with a Transformer encoder, LSTM_LN and LSTM.

    python recipes/imdb.py [--data-dir DIR] [--models encoder,lstm_ln,lstm]
                           [--encoder-epochs 3] [--lstm-epochs 4] ...

Learns a lowercase WordPiece vocabulary from the 25,000 training reviews,
trains the three classifiers, reports test accuracy on all 25,000 test
reviews, writes per-run JSON, the LSTM vs LSTM_LN plot and report.md to
docs/results/imdb/, and exports export/imdb_<model>/<version>/ (raw review
strings in, class probabilities out). Every field of
``keras_trm.jobs.imdb.ImdbConfig`` is a flag (``--help`` lists them).
"""

import argparse
import sys

from keras_trm.jobs import imdb
from keras_trm.jobs._classification import add_config_flags, config_from_args


def main(argv):
    parser = argparse.ArgumentParser(
        prog="recipes/imdb.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None,
                        help="data folder (default: KERAS_TRM_DATA_DIR, then "
                             "../shared/data beside the checkout)")
    parser.add_argument("--workdir", default="runs/imdb")
    parser.add_argument("--export-dir", default="export")
    parser.add_argument("--results-dir", default="docs/results/imdb")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the report and plots from the "
                             "results already in --workdir")
    add_config_flags(parser, imdb.ImdbConfig)
    args = parser.parse_args(argv)
    config = config_from_args(imdb.ImdbConfig, args)
    if args.report_only:
        imdb.write_report(args.workdir, args.results_dir, config)
        return
    imdb.run(config, data_dir=args.data_dir, workdir=args.workdir,
             export_dir=args.export_dir, results_dir=args.results_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
