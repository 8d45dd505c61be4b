"""Recipe: EN->DE Transformer on Multi30k (trains on a 2-core CPU).

    python recipes/translate_multi30k.py [--data-dir DIR] [--seed 1] ...

The same job as ``keras-trm train-translation``, with its defaults, chosen
on val (``docs/recipes/multi30k.md``): learns a joint SentencePiece BPE of
10,000 ids, trains transformer(N=3, d_model=256, d_ff=1024, h=4, dropout
0.3) with the paper's recipe (Noam schedule, Adam(0.9, 0.98, 1e-9), tied
embeddings, token-count batches of 2,048) and label smoothing 0.2 for 30
epochs or 45 minutes, logs greedy BLEU on the val split after every epoch,
averages the last k <= 5 epoch checkpoints (k chosen by greedy BLEU on
val), reports sacreBLEU (beam 5, α=1.2) on test_2016_flickr (decoded once,
at the end), and exports export/transformer_multi30k_en_de/<version>/.
Same flags as ``keras-trm train-translation``: ``--source-language de
--target-language en`` trains DE->EN; ``--dataset files --train-source ...``
trains on your own parallel files; ``--preset transformer_base`` uses the
paper's hyper-parameters (see recipes/translate_wmt14.py for WMT14).
"""

import sys

from keras_trm.cli import train_translation_main, run_recipe

if __name__ == "__main__":
    sys.exit(run_recipe(train_translation_main, prog="recipes/translate_multi30k.py"))
