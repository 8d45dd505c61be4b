"""sacreBLEU (beam 4, alpha 0.6) on test_2016_flickr of averaging the last k
epoch checkpoints of a Multi30k run, for each k given:

    python bench/eval_checkpoint_average.py runs/multi30k 5 3 1
"""
import os, sys, time, pathlib
os.environ["KERAS_BACKEND"] = "tensorflow"
import keras, keras_trm
from keras_trm.data import load_multi30k
from keras_trm.text import TextTokenizer, load_vocabulary
from keras_trm.training import average_checkpoints
from keras_trm.decoding import Translator, corpus_bleu

work = pathlib.Path(sys.argv[1])
paths = sorted((work / "checkpoints").iterdir())
print([p.name for p in paths])
vocab = load_vocabulary(work / "vocab_8000.txt")
tok = TextTokenizer(vocab)
src, ref = load_multi30k("test_2016_flickr")
model = keras.models.load_model(work / "model.keras")
for k in [int(a) for a in sys.argv[2:]]:
    if k == 1:
        model.load_weights(paths[-1])
    else:
        average_checkpoints(model, paths[-k:])
    t = time.time()
    hyps = Translator(model, tok, beam_size=4, length_penalty_alpha=0.6).translate_texts(src)
    bleu, sig, line = corpus_bleu(hyps, ref)
    print(f"last {k}: {line} ({time.time()-t:.0f} s)", flush=True)
