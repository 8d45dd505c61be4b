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
into shards and streamed; newstest2013; newstest2014). Offline (default)
it reads ``<data_dir>/wmt14_en_de``: the first 20,000 pairs of Europarl v7
(0.4% of the training data, out of domain for news) and, when present, the
36,826-pair pool of the WMT news test sets of other years (in domain), two
corpora weighted by ``--train-weights`` (default: by size), with the same
newstest2013 / newstest2014. The job itself reports both BLEU figures.

Every ``keras-trm train-translation`` flag works here; this recipe only
changes the defaults (``--dataset wmt14``, ``--preset transformer_base``,
``--workdir runs/wmt14``).
"""

import json
import sys

from keras_trm._runtime import (
    quiet_cuda_probe,
    reexec_with_allocator_tunables,
    set_log_level_default,
)
from keras_trm.cli import config_parser, parse_config, write_run_config
from keras_trm.jobs.translation import TranslationConfig, run

SAMPLES = {
    "en": ("The European Parliament approved the new budget on Tuesday.",
           "Increased safety for pedestrians"),
    "de": ("Das Europäische Parlament hat am Dienstag den neuen Haushalt gebilligt.",
           "Mehr Sicherheit für Fußgänger"),
}


def main(argv):
    parser = config_parser(
        "translate_wmt14.py", "WMT14 EN-DE (either direction): vocabulary, "
        "training, averaging, beam search on newstest2014, sacreBLEU + "
        "tokenized BLEU, export.", TranslationConfig, "runs/wmt14",
        results_dir=False)
    parser.add_argument("--online", action="store_true",
                        help="full WMT14 training data from tfds (else the "
                        "local Europarl slice): the same as --dataset "
                        "wmt14_tfds")
    parser.set_defaults(dataset="wmt14", preset="transformer_base")
    config, args = parse_config(parser, TranslationConfig, argv)
    if args.online:
        config.dataset = args.dataset = "wmt14_tfds"
    args.online = config.dataset == "wmt14_tfds"
    quiet_cuda_probe()
    write_run_config(parser, args)
    result = run(config, args.data_dir, args.workdir, args.export_dir,
                 samples=SAMPLES.get(config.source_language, ()))

    print(f"{result['test_split']}: sacreBLEU {result['test_bleu']} "
          f"({result['signature']}); tokenized BLEU with compound splitting "
          f"{result['test_tokenized_compound_split_bleu']} (paper: 27.3 base / "
          "28.4 big, EN->DE, full data)", flush=True)
    summary = {k: result[k] for k in (
        "test_bleu", "test_tokenized_compound_split_bleu", "signature",
        "parameters", "epochs", "train_minutes", "job_minutes", "export")}
    print(json.dumps(summary, indent=1))
    return result


if __name__ == "__main__":
    set_log_level_default()  # for the re-executed process (keras_trm._runtime)
    reexec_with_allocator_tunables()  # glibc malloc tunables
    main(sys.argv[1:])
