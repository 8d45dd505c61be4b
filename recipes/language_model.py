"""Recipe: Transformer-XL vs a vanilla Transformer LM (Dai et al. 2019).

    python recipes/language_model.py [--corpus tinyshakespeare|ptb]
        [--training.steps 4500] [--seg-len 64] [--mem-len 64] [--data-dir DIR] ...

Trains a 4-layer Transformer-XL (d_model 128, segments of 64, memory 64)
and a vanilla Transformer LM with the same number of parameters on the same
segments for the same number of steps (char-level Tiny Shakespeare by
default), reports test bits per character / perplexity of both, exports
export/transformer_xl_<corpus>/<version>/ and writes result.json, report.md
and curves.png to docs/results/language_model/. ``--help`` lists all flags
(one per ``keras_trm.jobs.language_model.LanguageModelConfig`` field);
the same as ``keras-trm train-lm``.
"""

import sys

from keras_trm._runtime import tune_allocator
from keras_trm.cli import train_lm_main

if __name__ == "__main__":
    tune_allocator()  # glibc malloc settings (keras_trm._runtime)
    sys.exit(train_lm_main(sys.argv[1:], prog="recipes/language_model.py"))
