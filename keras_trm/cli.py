"""``keras-trm``: command line entry points, one subcommand per recipe.

    keras-trm train-translation [--data-dir DIR] [--epochs N] ...
    keras-trm train-imdb [--models encoder,lstm_ln,lstm] [--limit 0] ...
    keras-trm train-mnist [--batch-sizes 128,8] [--norms none,batch,layer] ...
    keras-trm train-lm [--corpus tinyshakespeare|ptb] [--steps 1500] ...
    keras-trm translate --model export/<name>/<version> "A sentence." ...
    keras-trm serve --model_base_path export/<name> [--rest_api_port 8501] [--port 8500]

Every ``train-*`` subcommand has one flag per field of its job's config
dataclass (``keras_trm.cli_config``: ``--flag VALUE``, booleans ``--flag
true|false``), so ``keras-trm train-mnist --help`` lists them all. The
``recipes/*.py`` scripts call the same functions.
"""

import argparse
import json
import pathlib
import sys

from keras_trm.cli_config import (
    add_bool_flag,
    add_config_flags,
    config_from_args,
)

# Sentences translated at the end of train-translation, by source language.
SAMPLES = {
    "en": ("A man in a blue shirt is standing on a ladder cleaning windows.",
           "Two dogs are playing in the snow."),
    "de": ("Ein Mann in einem blauen Hemd steht auf einer Leiter.",
           "Zwei Hunde spielen im Schnee."),
}


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
        description="Train a Transformer on Multi30k EN->DE (default), "
        "WMT14 or your own parallel files, either direction; report "
        "sacreBLEU, export a raw-text SavedModel.")
    parser.add_argument("--data-dir", default=None,
                        help="data folder (else $KERAS_TRM_DATA_DIR, else "
                        "../shared/data beside the checkout)")
    parser.add_argument("--workdir", default="runs/multi30k")
    parser.add_argument("--export-dir", default="export")
    add_config_flags(parser, TranslationConfig)
    args = parser.parse_args(argv)
    config = config_from_args(TranslationConfig, args)
    result = run(config, args.data_dir, args.workdir, args.export_dir,
                 samples=SAMPLES.get(config.source_language, ()))
    summary = {k: result[k] for k in ("test_bleu", "parameters", "epochs",
                                      "train_minutes", "job_minutes", "export")}
    print(json.dumps(summary, indent=1))


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
    add_bool_flag(parser, "--enable_batching", "--enable-batching",
                  dest="enable_batching", default=False,
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
    flag("tensorflow_intra_op_parallelism", type=int, default=0,
         help="threads within one TensorFlow op (0: one per core); 1 serves "
         "many concurrent requests faster")
    flag("tensorflow_inter_op_parallelism", type=int, default=0,
         help="TensorFlow ops run at once (0: one per core)")
    flag("tensorflow_session_parallelism", type=int, default=0,
         help="both pools, where the two flags above are 0")
    flag("monitoring_config_file", default=None,
         help="text MonitoringConfig: prometheus_config { enable: true path: "
         "\"/monitoring/prometheus/metrics\" } serves TF Serving's metrics on "
         "the REST port")
    flag("shutdown_grace_seconds", type=float, default=30.0,
         help="on SIGTERM, how long in-flight requests may take to finish")
    return parser


def serve_main(argv):
    import logging

    args = serve_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from keras_trm.serving import (
        ModelManager, ModelServer, batching_options, configure_tensorflow_threads,
        model_server_config, monitoring_path)

    try:
        threads = configure_tensorflow_threads(
            args.tensorflow_intra_op_parallelism, args.tensorflow_inter_op_parallelism,
            args.tensorflow_session_parallelism)
        config = model_server_config(args.model_name, args.model_base_path,
                                     args.model_config_file)
        batching = (batching_options(args.batching_parameters_file)
                    if args.enable_batching else None)
        metrics_path = monitoring_path(args.monitoring_config_file)
        if metrics_path is not None and not args.rest_api_port:
            raise ValueError("--monitoring_config_file serves metrics on the REST "
                             "port; --rest_api_port is 0")
    except ValueError as err:
        print(f"keras-trm serve: {err}", file=sys.stderr)
        return 2
    manager = ModelManager(config, batching,
                           file_system_poll_wait_seconds=args.file_system_poll_wait_seconds)
    server = ModelServer(manager, host=args.host,
                         rest_api_port=args.rest_api_port or None, grpc_port=args.port,
                         rest_api_num_threads=args.rest_api_num_threads,
                         grpc_max_threads=args.grpc_max_threads,
                         max_request_bytes=args.max_request_bytes,
                         monitoring_path=metrics_path)
    server.serve_forever(grace=args.shutdown_grace_seconds,
                         info={"tensorflow_threads": threads})
    return 0


def _recipe_parser(prog, description, name, config_cls, report_only=False):
    """The flags every ``train-*`` recipe shares, then one per config field."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--data-dir", default=None,
                        help="data folder (default: $KERAS_TRM_DATA_DIR, then "
                             "../shared/data beside the checkout)")
    parser.add_argument("--workdir", default=f"runs/{name}")
    parser.add_argument("--export-dir", default="export")
    parser.add_argument(
        "--results-dir", default=None,
        help=f"report folder (default: <workdir>/results; pass "
             f"docs/results/{name} to update the report kept in the repository)")
    if report_only:
        parser.add_argument(
            "--report-only", action="store_true",
            help="only rewrite the report and plots from the results already "
                 "in --workdir")
    return add_config_flags(parser, config_cls)


def _classification_main(argv, job, config_cls, name, prog, description):
    parser = _recipe_parser(prog, description, name, config_cls,
                            report_only=True)
    args = parser.parse_args(argv)
    config = config_from_args(config_cls, args)
    if args.report_only:
        results_dir = args.results_dir or pathlib.Path(args.workdir) / "results"
        job.write_report(args.workdir, results_dir, config)
        return 0
    job.run(config, data_dir=args.data_dir, workdir=args.workdir,
            export_dir=args.export_dir, results_dir=args.results_dir)
    return 0


def train_imdb_main(argv, prog="keras-trm train-imdb"):
    """IMDB sentiment: Transformer encoder, LSTM_LN and LSTM classifiers
    (``keras_trm.jobs.imdb``)."""
    from keras_trm.jobs import imdb

    return _classification_main(
        argv, imdb, imdb.ImdbConfig, "imdb", prog,
        "IMDB sentiment with a Transformer encoder, LSTM_LN and LSTM: test "
        "accuracy on the 25,000 test reviews, LSTM vs LSTM_LN curves, raw-text "
        "SavedModels.")


def train_mnist_main(argv, prog="keras-trm train-mnist"):
    """MNIST LeNet without / with BatchNorm / with LayerNorm
    (``keras_trm.jobs.mnist``)."""
    from keras_trm.jobs import mnist

    return _classification_main(
        argv, mnist, mnist.MnistConfig, "mnist", prog,
        "MNIST LeNet without / with BatchNorm / with LayerNorm at two batch "
        "sizes: test accuracy, convergence plots, SavedModels.")


def train_lm_main(argv, prog="keras-trm train-lm"):
    """Transformer-XL vs a vanilla Transformer LM
    (``keras_trm.jobs.language_model``); prints a JSON summary."""
    from keras_trm.jobs.language_model import LanguageModelConfig, run

    parser = _recipe_parser(
        prog, "Train Transformer-XL and a vanilla Transformer LM on the same "
        "segments, report test bpc/perplexity, export Transformer-XL.",
        "language_model", LanguageModelConfig)
    args = parser.parse_args(argv)
    command = ("python " if prog.endswith(".py") else "") + " ".join(
        [prog, *argv])
    result = run(config_from_args(LanguageModelConfig, args), args.data_dir,
                 args.workdir, args.export_dir, args.results_dir,
                 command=command.strip())
    summary = {
        "transformer_xl_test": result["transformer_xl"]["test"],
        "vanilla_test_sliding_window": result["vanilla"]["test_sliding_window"],
        "vanilla_test_disjoint": result["vanilla"]["test_disjoint"],
        "parameters": [result["transformer_xl"]["parameters"],
                       result["vanilla"]["parameters"]],
        "job_minutes": result["job_minutes"], "export": result["export"],
    }
    print(json.dumps(summary, indent=1))
    return 0


COMMANDS = {
    "train-translation": train_translation_main,
    "train-imdb": train_imdb_main,
    "train-mnist": train_mnist_main,
    "train-lm": train_lm_main,
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
    if argv and argv[0] in ("-h", "--help"):
        print("usage: keras-trm {" + ",".join(COMMANDS) + "} ...\n\n"
              + __doc__)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print("usage: keras-trm {" + ",".join(COMMANDS) + "} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
