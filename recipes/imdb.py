"""Recipe: IMDB sentiment with a Transformer encoder, LSTM_LN and LSTM.

    python recipes/imdb.py [--data-dir DIR] [--models encoder,lstm_ln,lstm]
                           [--encoder-epochs 3] [--lstm-epochs 4] ...

Learns a lowercase WordPiece vocabulary from the 25,000 training reviews,
trains the three classifiers, reports test accuracy on all 25,000 test
reviews, writes per-run JSON, the LSTM vs LSTM_LN plot and report.md to
docs/results/imdb/, and exports export/imdb_<model>/<version>/ (raw review
strings in, class probabilities out). Every field of
``keras_trm.jobs.imdb.ImdbConfig`` is a flag (``--help`` lists them);
the same as ``keras-trm train-imdb``.
"""

import sys

from keras_trm.cli import train_imdb_main, run_recipe

if __name__ == "__main__":
    sys.exit(run_recipe(train_imdb_main, prog="recipes/imdb.py"))
