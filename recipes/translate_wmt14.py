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
training pairs; newstest2013; newstest2014). Offline (default) it reads
``<data_dir>/wmt14_en_de``: the first 20,000 pairs of Europarl v7 (0.4% of
the training data and out of domain for news, so expect a low score), with
the same newstest2013 / newstest2014.

Every ``keras-trm train-translation`` flag works here; this recipe only
changes the defaults (``--dataset wmt14``, ``--preset transformer_base``,
``--workdir runs/wmt14``).
"""

import json
import pathlib
import sys

from keras_trm._runtime import (
    quiet_cuda_probe,
    reexec_with_allocator_tunables,
    set_log_level_default,
)
from keras_trm.cli import config_parser, parse_config, write_run_config
from keras_trm.data import load_wmt14
from keras_trm.decoding.bleu import compound_split_bleu
from keras_trm.jobs.translation import TranslationConfig, run
from keras_trm.utils import write_json

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
    args.online = online = config.dataset == "wmt14_tfds"
    quiet_cuda_probe()
    write_run_config(parser, args)
    result = run(config, args.data_dir, args.workdir, args.export_dir,
                 samples=SAMPLES.get(config.source_language, ()))

    # The paper's figure: tokenized BLEU with compound splitting on the
    # same newstest2014 outputs (t2t's get_ende_bleu.sh).
    workdir = pathlib.Path(args.workdir)
    hyp_path = workdir / f"{result['test_split']}.hyp.{config.target_language}"
    hyps = hyp_path.read_text(encoding="utf-8").split("\n")[:-1]
    _, refs = load_wmt14("test", args.data_dir, config.source_language,
                         config.target_language, online=online)
    refs = refs[: len(hyps)]  # --limit smoke runs decode a prefix
    tok_bleu, tok_line = compound_split_bleu(hyps, refs, config.target_language)
    result["test_tokenized_compound_split_bleu"] = round(tok_bleu, 2)
    result["test_tokenized_compound_split_bleu_line"] = tok_line
    write_json(workdir / "result.json", result)
    print(f"{result['test_split']}: sacreBLEU {result['test_bleu']} "
          f"({result['signature']}); tokenized BLEU with compound splitting "
          f"{tok_bleu:.2f} (paper: 27.3 base / 28.4 big, EN->DE, full data)",
          flush=True)
    summary = {k: result[k] for k in (
        "test_bleu", "test_tokenized_compound_split_bleu", "signature",
        "parameters", "epochs", "train_minutes", "job_minutes", "export")}
    print(json.dumps(summary, indent=1))
    return result


if __name__ == "__main__":
    set_log_level_default()  # for the re-executed process (keras_trm._runtime)
    reexec_with_allocator_tunables()  # glibc malloc tunables
    main(sys.argv[1:])
