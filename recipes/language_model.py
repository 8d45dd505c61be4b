"""Recipe: Transformer-XL vs a vanilla Transformer LM (Dai et al. 2019).

    python recipes/language_model.py [--corpus tinyshakespeare|ptb]
        [--training.steps 4500] [--seg-len 64] [--mem-len 64] [--data-dir DIR] ...

Trains a Transformer-XL and a vanilla Transformer LM with the same number
of parameters on the same segments for the same number of steps, reports
test bits per character / perplexity of both, exports
export/transformer_xl_<corpus>/<version>/ and writes result.json, report.md
and curves.png to <workdir>/results/. Char-level Tiny Shakespeare by
default: 4 layers, d_model 128, segments of 64, memory 64, 4,500 steps.
``--corpus ptb`` takes the PTB recipe
(``keras_trm.jobs.language_model_config.CORPUS_RECIPES``): d_model 256, d_ff
1024, dropout 0.3, attention dropout 0.1, bfloat16 where the CPU has it,
and a 60-minute training budget that the cosine schedule is fitted to.
``--help`` lists all flags (one per ``LanguageModelConfig`` field; a flag
wins over the corpus's recipe); the same as ``keras-trm train-lm``.
"""

import sys

from keras_trm.cli import train_lm_main, run_recipe

if __name__ == "__main__":
    sys.exit(run_recipe(train_lm_main, prog="recipes/language_model.py"))
