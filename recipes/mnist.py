"""Recipe: MNIST LeNet without / with BatchNorm / with LayerNorm, at batch
size 128 and 8.

    python recipes/mnist.py [--data-dir DIR] [--epochs 8]
                            [--batch-sizes 128,8] [--norms none,batch,layer]

Trains every (batch size, normalization) pair for the same number of
epochs, scores the full 10,000-digit test set after each epoch, writes
per-run JSON, one plot per batch size and report.md to docs/results/mnist/,
and exports export/mnist_lenet_<norm>_b<batch>/<version>/ (uint8 images
(batch, 28, 28) in, probabilities out). Every field of
``keras_trm.jobs.mnist.MnistConfig`` is a flag (``--help`` lists them).
"""

import argparse
import sys

from keras_trm.jobs import mnist
from keras_trm.jobs._classification import add_config_flags, config_from_args


def main(argv):
    parser = argparse.ArgumentParser(
        prog="recipes/mnist.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None,
                        help="data folder (default: KERAS_TRM_DATA_DIR, then "
                             "../shared/data beside the checkout)")
    parser.add_argument("--workdir", default="runs/mnist")
    parser.add_argument("--export-dir", default="export")
    parser.add_argument("--results-dir", default="docs/results/mnist")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the report and plots from the "
                             "results already in --workdir")
    add_config_flags(parser, mnist.MnistConfig)
    args = parser.parse_args(argv)
    config = config_from_args(mnist.MnistConfig, args)
    if args.report_only:
        mnist.write_report(args.workdir, args.results_dir, config)
        return
    mnist.run(config, data_dir=args.data_dir, workdir=args.workdir,
              export_dir=args.export_dir, results_dir=args.results_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
