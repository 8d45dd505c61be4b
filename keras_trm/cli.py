"""``keras-trm``: command line entry points.

    keras-trm train-translation [--data-dir DIR] [--epochs N] ...
    keras-trm translate --model export/<name>/<version> "A sentence." ...
    keras-trm serve --model_base_path export/<name> [--rest_api_port 8501] [--port 8500]
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


def _flag_bool(text):
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def serve_parser():
    """``keras-trm serve``'s flags: ``tensorflow_model_server``'s own names
    (``--model_base_path``; the dashed ``--model-base-path`` works too)."""
    parser = argparse.ArgumentParser(
        prog="keras-trm serve",
        description="Serve export folders on TF Serving's REST and gRPC APIs "
        "(same flags as tensorflow_model_server).")

    def flag(name, **kwargs):
        parser.add_argument("--" + name, "--" + name.replace("_", "-"), dest=name,
                            **kwargs)

    flag("port", type=int, default=8500, help="gRPC port (default 8500)")
    flag("rest_api_port", type=int, default=8501,
         help="REST port (default 8501; 0 serves no REST)")
    flag("model_name", action="append", default=[],
         help="model name in requests (default: the base path's folder name); "
         "repeat with --model_base_path for several models")
    flag("model_base_path", action="append", default=[],
         help="folder of <version>/ SavedModels; repeatable")
    flag("model_config_file", default=None,
         help="text ModelServerConfig (several models, version policies, labels)")
    flag("enable_batching", type=_flag_bool, nargs="?", const=True, default=False,
         help="merge concurrent requests into batched calls")
    flag("batching_parameters_file", default=None,
         help="text BatchingParameters (max_batch_size, batch_timeout_micros, "
         "num_batch_threads, max_enqueued_batches, allowed_batch_sizes)")
    flag("file_system_poll_wait_seconds", type=float, default=1.0,
         help="seconds between scans for new versions (0: once, <0: never)")
    flag("rest_api_num_threads", type=int, default=32,
         help="REST worker threads (default 32)")
    flag("grpc_max_threads", type=int, default=32, help="gRPC worker threads")
    flag("host", default="127.0.0.1",
         help="interface to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    flag("max_request_bytes", type=int, default=4 * 1024 * 1024,
         help="largest REST body / gRPC message (default 4 MiB; more gets 413)")
    flag("shutdown_grace_seconds", type=float, default=30.0,
         help="on SIGTERM, how long in-flight requests may take to finish")
    return parser


def serve_main(argv):
    import logging

    args = serve_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from keras_trm.serving import (
        ModelManager, ModelServer, batching_options, model_server_config)

    try:
        config = model_server_config(args.model_name, args.model_base_path,
                                     args.model_config_file)
        batching = (batching_options(args.batching_parameters_file)
                    if args.enable_batching else None)
    except ValueError as err:
        print(f"keras-trm serve: {err}", file=sys.stderr)
        return 2
    manager = ModelManager(config, batching,
                           file_system_poll_wait_seconds=args.file_system_poll_wait_seconds)
    server = ModelServer(manager, host=args.host,
                         rest_api_port=args.rest_api_port or None, grpc_port=args.port,
                         rest_api_num_threads=args.rest_api_num_threads,
                         grpc_max_threads=args.grpc_max_threads,
                         max_request_bytes=args.max_request_bytes)
    server.serve_forever(grace=args.shutdown_grace_seconds)
    return 0


COMMANDS = {
    "train-translation": train_translation_main,
    "translate": translate_main,
    "serve": serve_main,
}


def main(argv=None):
    if argv is None and sys.argv[1:2] and sys.argv[1].startswith("train"):
        # Training commands re-run themselves once with glibc malloc
        # tunables (fewer page faults, less kernel time); see _runtime.
        from keras_trm._runtime import reexec_with_allocator_tunables

        reexec_with_allocator_tunables()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: keras-trm {" + ",".join(COMMANDS) + "} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
