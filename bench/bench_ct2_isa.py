"""Benchmark: CTranslate2 int8 quality on CPUs with and without VNNI.

    python bench/bench_ct2_isa.py --model runs/multi30k/model.keras
        --vocab runs/multi30k/vocab_8000.txt
        [--out bench/results/ctranslate2_isa.json]

Exports the model to CTranslate2 (float32 and int8 weights), then decodes
Multi30k test_2016_flickr (1,000 sentences, greedy and beam 4, alpha 0.6)
in fresh processes, each with its own instruction-set cap:

- ``native``: the host as it is;
- ``avx2``: ``MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
  CT2_FORCE_CPU_ISA=AVX2``, i.e. an AVX2 CPU without VNNI as far as
  CTranslate2's GEMM libraries go.

For int8 weights each setting runs ``CTranslate2Translator``'s default
compute type (where there is no VNNI: int16 where CTranslate2 offers it,
its MKL backend on Intel CPUs, else float32) and, for the record,
CTranslate2's own int8 GEMM (``compute_type="int8_float32"``). sacreBLEU
and the share of outputs identical to float32 greedy / beam.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SETTINGS = {
    "native": {},
    "avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "CT2_FORCE_CPU_ISA": "AVX2"},
}

# Run in a child process: the ISA caps must be set before MKL loads.
CHILD = """
import json, sys, time
from keras_trm.export.ctranslate2 import CTranslate2Translator, cpu_has_int8_dot_product
from keras_trm.decoding import corpus_bleu
args = json.loads(open(sys.argv[1], encoding="utf-8").read())
sources = args["sources"]; references = args["references"]
import ctranslate2
out = {"vnni": cpu_has_int8_dot_product(),
       "supported_compute_types": sorted(ctranslate2.get_supported_compute_types("cpu"))}
for name, path, compute_type in args["runs"]:
    translator = CTranslate2Translator(path, num_threads=args["threads"],
                                       compute_type=compute_type)
    row = {"compute_type": translator.compute_type}
    for beam in (1, args["beam_size"]):
        start = time.perf_counter()
        hyps = translator.translate_texts(sources, beam_size=beam,
                                          length_penalty=args["length_penalty"])
        row[f"beam{beam}"] = {
            "bleu": round(corpus_bleu(hyps, references)[0], 2),
            "sentences_per_second": round(len(sources) / (time.perf_counter() - start), 1),
            "hypotheses": hyps}
    out[name] = row
print(json.dumps(out))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="runs/multi30k/model.keras")
    p.add_argument("--vocab", default="runs/multi30k/vocab_8000.txt")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--length-penalty", type=float, default=0.6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results/ctranslate2_isa.json")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import keras

    import keras_trm  # noqa: F401  (registers the layers)
    from keras_trm.data import load_multi30k
    from keras_trm.export.ctranslate2 import export_ctranslate2
    from keras_trm.utils.files import write_json

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from bench_decoding import host_info

    sources, references = load_multi30k(args.split, args.data_dir)
    model = keras.models.load_model(args.model)
    root = pathlib.Path(tempfile.mkdtemp(prefix="ct2_isa_"))
    paths = {q: str(export_ctranslate2(model, root / q, args.vocab, quantization=q))
             for q in ("float32", "int8")}
    runs = [("float32", paths["float32"], "default"),
            ("int8_default", paths["int8"], "default"),
            ("int8_ct2_int8_gemm", paths["int8"], "int8_float32")]
    child_args = root / "child_args.json"
    child_args.write_text(json.dumps({
        "sources": list(sources), "references": list(references), "runs": runs,
        "threads": args.threads, "beam_size": args.beam_size,
        "length_penalty": args.length_penalty}), encoding="utf-8")
    results = {}
    for setting, caps in SETTINGS.items():
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **caps)
        proc = subprocess.run([sys.executable, "-c", CHILD, str(child_args)], env=env,
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{setting} child failed:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        keys = ("beam1", f"beam{args.beam_size}")
        reference = {k: out["float32"][k]["hypotheses"] for k in keys}
        for name, row in out.items():
            if name in ("vnni", "supported_compute_types"):
                continue
            for key in keys:
                hyps = row[key].pop("hypotheses")
                same = sum(a == b for a, b in zip(hyps, reference[key]))
                row[key]["same_as_float32"] = round(same / len(hyps), 3)
        results[setting] = {"env": caps, **out}
        print(setting, json.dumps(results[setting], indent=1))
    write_json(args.out, {
        "what": "CTranslate2 export of one model: int8 quality with and without "
                "VNNI (caps set per child process)",
        "command": "python bench/bench_ct2_isa.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "split": args.split, "sentences": len(sources), "host": host_info(),
        "results": results})


if __name__ == "__main__":
    main()
