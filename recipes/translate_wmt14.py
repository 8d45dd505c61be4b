"""Recipe: the paper's WMT14 English-German pipeline, end to end.

    python recipes/translate_wmt14.py [--online] [--preset transformer_base]
        [--source-language en --target-language de] [--time-budget-minutes M] ...

Learns a joint SentencePiece BPE vocabulary (the paper's is a shared
~37,000-token BPE) from the training data, trains with the preset's
hyper-parameters (Noam schedule with warmup 4,000, Adam(0.9, 0.98, 1e-9),
label smoothing 0.1, token-count batches), logs greedy BLEU on newstest2013
after every epoch, averages the last k epoch checkpoints (k chosen on
newstest2013), decodes newstest2014 once with beam 4, α = 0.6 and output
length <= input length + 50, reports sacreBLEU (with its signature) and the
paper's tokenized BLEU with compound splitting, and exports the raw-text
SavedModel to export/transformer_wmt14_<src>_<tgt>/<version>/.

Data: ``--online`` reads tfds ``wmt14_translate/de-en`` (about 4.5M
training pairs, written once to the work folder as text, then prepared
once into memory-mapped token ids and batched from them; newstest2013;
newstest2014). Offline (default)
it reads ``<data_dir>/wmt14_en_de``: the first 20,000 pairs of Europarl v7
(0.4% of the training data, out of domain for news) and, when present, the
36,826-pair pool of the WMT news test sets of other years (in domain), two
corpora weighted by ``--train-weights`` (default: by size), with the same
newstest2013 / newstest2014. The job itself reports both BLEU figures.

Every ``keras-trm train-translation`` flag works here; this recipe only
changes the defaults (``--dataset wmt14``, ``--preset transformer_base``,
``--workdir runs/wmt14``) and adds ``--online``. The job's own log reports
both BLEU figures and the sacreBLEU signature (paper: 27.3 base / 28.4 big,
EN->DE, full data).
"""

import sys

from keras_trm.cli import run_recipe, train_translation_main

SAMPLES = {
    "en": ("The European Parliament approved the new budget on Tuesday.",
           "Increased safety for pedestrians"),
    "de": ("Das Europäische Parlament hat am Dienstag den neuen Haushalt gebilligt.",
           "Mehr Sicherheit für Fußgänger"),
}


def main(argv):
    """``keras-trm train-translation`` with this recipe's defaults; returns 0."""
    return train_translation_main(
        argv, prog="recipes/translate_wmt14.py", workdir="runs/wmt14",
        defaults={"dataset": "wmt14", "preset": "transformer_base"}, samples=SAMPLES,
        online_flag=True,
        summary_keys=("test_bleu", "test_tokenized_compound_split_bleu", "signature",
                      "parameters", "epochs", "train_minutes", "job_minutes", "export"))


if __name__ == "__main__":
    sys.exit(run_recipe(main))
