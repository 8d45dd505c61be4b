"""Recipe: MNIST LeNet without / with BatchNorm / with LayerNorm, at batch
size 128 and 8.

    python recipes/mnist.py [--data-dir DIR] [--epochs 8]
                            [--batch-sizes 128,8] [--norms none,batch,layer]

Trains every (batch size, normalization) pair for the same number of
epochs, scores the full 10,000-digit test set after each epoch, writes
per-run JSON, one plot per batch size and report.md to docs/results/mnist/,
and exports export/mnist_lenet_<norm>_b<batch>/<version>/ (uint8 images
(batch, 28, 28) in, probabilities out). Every field of
``keras_trm.jobs.mnist.MnistConfig`` is a flag (``--help`` lists them);
the same as ``keras-trm train-mnist``.
"""

import sys

from keras_trm.cli import train_mnist_main, run_recipe

if __name__ == "__main__":
    sys.exit(run_recipe(train_mnist_main, prog="recipes/mnist.py"))
