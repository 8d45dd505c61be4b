"""BLEU and speed of the old beam search (finished hypotheses keep their beam
slots; stop once the top slot has ended) against the new one (the beam stays
full; exact stop under the length penalty), on the same weights:

    python bench/compare_beam_search.py --model runs/multi30k/model.keras \\
        --vocab runs/multi30k/vocab_8000.txt

The old implementation is ``keras_trm/decoding/search.py`` at commit
``--old-commit`` (f4b6aa9, main before the change), read with ``git show``
and imported from a temporary file. Both decode the Multi30k ``val`` split
(1,014 sentences) with beam 4, α 0.6 (Vaswani et al. 2017, §6.1) through
``Translator`` (raw text in, text out, one tf.function), as the job does.
Writes ``bench/results/beam_search_old_vs_new.json``: sacreBLEU line of each
(``keras_trm.decoding.corpus_bleu``), sentences/s of each (after one warm-up
batch that traces the function), the number of sentences whose output
differs, and the host CPU.
"""
import argparse
import importlib.util
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_trm  # noqa: E402,F401
from keras_trm.utils import write_json  # noqa: E402
from keras_trm.data import load_multi30k, resolve_data_dir  # noqa: E402
from keras_trm.decoding import Translator, corpus_bleu  # noqa: E402
from keras_trm.decoding import search as new_search  # noqa: E402
from keras_trm.text import TextTokenizer, load_vocabulary  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_old_search(commit):
    """``keras_trm/decoding/search.py`` at ``commit`` as a module."""
    source = subprocess.run(
        ["git", "show", f"{commit}:keras_trm/decoding/search.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / f"search_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"search_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SearchTranslator(Translator):
    """``Translator`` whose beam search is the given ``beam_search``."""

    def __init__(self, search_fn, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._search_fn = search_fn

    def generate_ids(self, encoder_tokens):
        return self._search_fn(
            self.model, encoder_tokens, beam_size=self.beam_size,
            length_penalty_alpha=self.length_penalty,
        )


def cpu_model():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def decode(translator, sources, batch_size):
    translator.translate(tf.constant(sources[:batch_size]))  # trace once
    start = time.perf_counter()
    hyps = translator.translate_texts(sources, batch_size=batch_size)
    return hyps, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a saved model.keras")
    parser.add_argument("--vocab", required=True, help="its vocabulary file")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--split", default="val")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--old-commit", default="f4b6aa9")
    parser.add_argument("--limit", type=int, default=None,
                        help="decode only the first N sentences (smoke test)")
    parser.add_argument(
        "--out", default=str(ROOT / "bench/results/beam_search_old_vs_new.json"))
    args = parser.parse_args(argv)

    old_search = load_old_search(args.old_commit)
    model = keras.models.load_model(args.model)
    tokenizer = TextTokenizer(load_vocabulary(args.vocab))
    sources, references = load_multi30k(args.split, resolve_data_dir(args.data_dir))
    if args.limit:
        sources, references = sources[:args.limit], references[:args.limit]

    result = {
        "model": str(args.model),
        "split": args.split,
        "sentences": len(sources),
        "beam_size": args.beam_size,
        "length_penalty_alpha": args.alpha,
        "batch_size": args.batch_size,
        "old_implementation": f"keras_trm/decoding/search.py at {args.old_commit}",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "tensorflow": tf.__version__,
        "python": sys.version.split()[0],
    }
    outputs = {}
    for name, fn in (("old", old_search.beam_search),
                     ("new", new_search.beam_search)):
        translator = SearchTranslator(
            fn, model, tokenizer, beam_size=args.beam_size,
            length_penalty=args.alpha,
        )
        hyps, seconds = decode(translator, sources, args.batch_size)
        bleu, signature, line = corpus_bleu(hyps, references)
        outputs[name] = hyps
        result[name] = {
            "bleu": round(bleu, 2),
            "bleu_line": line,
            "seconds": round(seconds, 1),
            "sentences_per_second": round(len(sources) / seconds, 1),
        }
        result["signature"] = signature
        print(f"{name}: {line} ({len(sources) / seconds:.1f} sentences/s)",
              flush=True)
    result["sentences_differing"] = sum(
        a != b for a, b in zip(outputs["old"], outputs["new"]))
    print(f"{result['sentences_differing']} of {len(sources)} outputs differ")

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
