"""Re-decode a finished translation job's test split with this revision's
search and compare with the hypotheses the job wrote.

    python bench/redecode_test_split.py --workdir runs/wmt14 \\
        [--data-dir ../shared/data] [--out bench/results/redecode_wmt14.json]

Reads the job's ``config.yaml``, ``model.keras`` and ``<test>.hyp.<lang>``;
decodes the test split as the job does (``Translator`` over the float32
weights, beam and length penalty of the config, batches of 100) and writes
sacreBLEU, the job's BLEU and the number of identical outputs: a search
change that claims identical outputs is checked on a real job's model.
The tokenizer is the job's vocabulary file when the run folder still has
it, else relearned the job's way (seeded) into a scratch folder and
checked against the vocabulary of the job's export.
"""

import argparse
import json
import pathlib
import shutil
import sys
import tempfile
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="the job's run folder")
    p.add_argument("--data-dir", default=None,
                   help="data folder (default: $KERAS_TRM_DATA_DIR)")
    p.add_argument("--out", default=None, help="JSON to write (default: print)")
    args = p.parse_args(argv)

    import keras
    import yaml

    from keras_trm.data import resolve_data_dir
    from keras_trm.data.translation import (
        load_translation_splits,
        translation_train_files,
    )
    from keras_trm.cli import read_run_config
    from keras_trm.decoding import Translator, corpus_bleu
    from keras_trm.jobs.translation import TranslationConfig, prepare_tokenizer
    from keras_trm.models import as_transformer
    from keras_trm.training import float32_copy
    from keras_trm.utils import write_json

    run = pathlib.Path(args.workdir)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    config = read_run_config(run / "config.yaml", TranslationConfig)
    data_dir = resolve_data_dir(args.data_dir)
    files = {name: getattr(config, name) for name in (
        "train_source", "train_target", "validation_source",
        "validation_target", "test_source", "test_target")}
    local = data_dir if config.dataset != "files" else None
    corpora = translation_train_files(config.dataset, local, config.source_language,
                                      config.target_language, files=files)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="redecode_"))
    for pattern in ("vocab_*.txt", "spm_*.model"):
        for path in run.glob(pattern):
            shutil.copy(path, scratch)
    tokenizer = prepare_tokenizer(config, corpora, scratch)
    export_dir = pathlib.Path(saved.get("export_dir") or "export")
    exports = sorted(export_dir.glob("*/*/assets.extra/vocab.txt"))
    same_vocabulary = None
    if exports:
        exported = exports[-1].read_text(encoding="utf-8").split("\n")
        same_vocabulary = list(tokenizer.vocabulary) == exported[:-1]
    splits = load_translation_splits(config.dataset, local, config.source_language,
                                     config.target_language, files=files,
                                     include_train=False)
    sources, references = splits.test
    test_name = splits.names["test"]
    model = float32_copy(as_transformer(keras.saving.load_model(run / "model.keras")))
    translator = Translator(model, tokenizer, beam_size=config.beam_size,
                            length_penalty=config.length_penalty,
                            early_stopping=getattr(config, "early_stopping", True))
    start = time.time()
    hyps = translator.translate_texts(sources, batch_size=100)
    seconds = time.time() - start
    old = (run / f"{test_name}.hyp.{config.target_language}").read_text(
        encoding="utf-8").split("\n")[:len(hyps)]
    bleu, signature, line = corpus_bleu(hyps, references)
    result = {
        "command": "python bench/redecode_test_split.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "workdir": str(run), "split": test_name, "sentences": len(hyps),
        "beam_size": config.beam_size, "length_penalty": config.length_penalty,
        "bleu": round(bleu, 2), "bleu_line": line, "bleu_signature": signature,
        "job_bleu": json.loads((run / "result.json").read_text())["test_bleu"],
        "identical_to_job_hypotheses": sum(a == b for a, b in zip(hyps, old)),
        "vocabulary_equals_export": same_vocabulary,
        "decode_seconds": round(seconds, 1),
    }
    shutil.rmtree(scratch, ignore_errors=True)
    if args.out:
        write_json(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
