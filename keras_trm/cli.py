"""``keras-trm``: command line entry points.

    keras-trm train-translation [--data-dir DIR] [--epochs N] ...
    keras-trm translate --model export/<name>/<version> "A sentence." ...
    keras-trm serve --model-base-path export/<name> [--port 8501]
"""

import argparse
import dataclasses
import json
import sys

SAMPLES = (
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two dogs are playing in the snow.",
)


def _add_config_flags(parser, config_cls):
    for field in dataclasses.fields(config_cls):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=field.default,
                            help=f"(default: {field.default})")


def _config_from_args(config_cls, args):
    return config_cls(**{f.name: getattr(args, f.name)
                         for f in dataclasses.fields(config_cls)})


def translate_main(argv):
    parser = argparse.ArgumentParser(prog="keras-trm translate")
    parser.add_argument("--model", required=True,
                        help="SavedModel folder export/<name>/<version>")
    parser.add_argument("sentences", nargs="*",
                        help="English sentences (default: read stdin lines)")
    args = parser.parse_args(argv)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin]
    serve = tf.saved_model.load(args.model).signatures["serving_default"]
    outputs = serve(tf.constant(sentences, tf.string))
    (out,) = outputs.values()
    for line in out.numpy():
        print(line.decode("utf-8"))


def train_translation_main(argv):
    from keras_trm.jobs.translation import TranslationConfig, run

    parser = argparse.ArgumentParser(
        prog="keras-trm train-translation",
        description="Train EN->DE on Multi30k, report sacreBLEU, export a "
        "raw-text SavedModel.")
    parser.add_argument("--data-dir", default=None,
                        help="data folder (else $KERAS_TRM_DATA_DIR, else "
                        "../shared/data beside the checkout)")
    parser.add_argument("--workdir", default="runs/multi30k")
    parser.add_argument("--export-dir", default="export")
    _add_config_flags(parser, TranslationConfig)
    args = parser.parse_args(argv)
    result = run(_config_from_args(TranslationConfig, args), args.data_dir,
                 args.workdir, args.export_dir, samples=SAMPLES)
    summary = {k: result[k] for k in ("test_bleu", "parameters", "epochs",
                                      "train_minutes", "job_minutes", "export")}
    print(json.dumps(summary, indent=1))


def serve_main(argv):
    parser = argparse.ArgumentParser(
        prog="keras-trm serve",
        description="Serve an export folder on TF Serving's REST API "
        "(/v1/models/<name>:predict).")
    parser.add_argument("--model-base-path", required=True,
                        help="export/<model_name>: the folder of versions")
    parser.add_argument("--model-name", default=None,
                        help="name in the URLs (default: the folder name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8501)
    args = parser.parse_args(argv)
    from keras_trm.serving import create_app

    app = create_app(args.model_base_path, args.model_name)
    app.run(host=args.host, port=args.port, threaded=True)


COMMANDS = {
    "train-translation": train_translation_main,
    "translate": translate_main,
    "serve": serve_main,
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: keras-trm {" + ",".join(COMMANDS) + "} ...", file=sys.stderr)
        return 2
    COMMANDS[argv[0]](argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
