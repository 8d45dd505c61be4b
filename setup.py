from setuptools import find_packages, setup

# keras-trm serve: TF Serving's REST (flask + waitress) and gRPC APIs, its
# warm-up request protos, --monitoring_config_file (Prometheus).
SERVE = ["flask>=3.0", "waitress>=3.0", "grpcio>=1.60",
         "tensorflow-serving-api>=2.21,<2.22", "prometheus-client>=0.20"]
LITERT = ["ai-edge-litert>=2.0"]  # the LiteRT export and its interpreter
PLOTS = ["matplotlib>=3.8"]  # the recipes' report plots (keras_trm.training.plots)

setup(
    name="keras_trm",
    version="0.1.0",
    description="The original Transformer family (Transformer, BERT-style "
    "encoder, Transformer-XL, Layer Normalization) for Keras 3.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["keras_trm", "keras_trm.*"]),
    python_requires=">=3.10",
    # The core: layers, models, training, data, text, decoding, the jobs and
    # the SavedModel export. The server, LiteRT and plots are extras; using
    # one without it raises an ImportError naming the extra
    # (keras_trm._optional.require_extra).
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "keras>=3.10,<4",
        "keras-hub>=0.32",
        "tensorflow-datasets>=4.9",
        "sacrebleu>=2.4",
        "sacremoses>=0.1",
        "sentencepiece>=0.2",
        "tqdm>=4.66",
        # keras-trm train-* flags and --config YAML from the config dataclasses
        "jsonargparse[signatures]>=4.40,<5",
        "numpy",
    ],
    extras_require={
        "serve": SERVE,
        "litert": LITERT,
        "plots": PLOTS,
        "dev": ["pytest>=8", "pytest-xdist>=3.5",  # -n 2: the suite on two processes
                # the core's tests under KERAS_BACKEND=jax and torch (.ci/run)
                "jax[cpu]>=0.4.30", "torch>=2.4",
                "requests>=2.31", "psutil>=5.9",
                # notebooks/ executed by tests/test_notebooks.py
                "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29",
                # the suite tests every extra
                *SERVE, *LITERT, *PLOTS],
        "ctranslate2": ["ctranslate2>=4.0"],
        # NVIDIA GPUs: TensorFlow with the CUDA 12 libraries it is built for
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22"],
        # mkdocs.yml: the docs site, built by .ci/run with --strict
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10",
                 "mkdocstrings[python]>=0.26,<2"],
    },
    entry_points={"console_scripts": ["keras-trm=keras_trm.cli:main"]},
)
