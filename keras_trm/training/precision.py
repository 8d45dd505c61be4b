"""Mixed precision: which compute dtype a training job uses.

Keras mixed precision (``keras.mixed_precision``, Micikevicius et al. 2018)
keeps the variables in float32 and computes the layers in a 16-bit type.
On CPUs, bfloat16 only pays where the CPU has native bfloat16 dot products
(x86 ``avx512_bf16`` or ``amx_bf16``): oneDNN then runs bfloat16 matmuls
faster than float32, and ``"auto"`` picks ``"mixed_bfloat16"``.
Elsewhere bfloat16 is emulated and slower, so ``"auto"`` stays in float32.
That holds under TensorFlow only: under JAX, XLA's CPU backend trained no
faster in bfloat16 on such a CPU (0.97x float32's tokens/s,
``bench/results/train_step_jax_cpu_bf16_vs_float32.json``), so ``"auto"`` is
float32 under every other backend.
``"mixed_float16"`` is meant for GPUs and is only ever used when asked for
explicitly.

Numerics under a 16-bit policy (checked by ``tests/test_precision.py``):
attention softmax, the output logits of the tied embedding, the loss and the
LayerNormalization statistics are computed in float32.

Whether ``"auto"`` picks bfloat16 on a bfloat16 CPU is a measured decision
(``bench/bench_translation.py`` at 32da1ca and the Multi30k job):
``AUTO_BF16_ON_NATIVE_CPU`` below; it does. A model trained so computes in
bfloat16 when it decodes and in its exports too: fast where the CPU has
native bfloat16, emulated (slow) elsewhere, so train with
``--precision float32`` for a model that will be served on other CPUs.
"""

import logging
import os
import platform

import keras

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
CHOICES = ("auto",) + POLICIES

# "auto" turns bfloat16 on only where it was measured to pay: >= 1.3x the
# float32 real target tokens/s AND Multi30k BLEU within 0.5 of float32, on
# a CPU with native bfloat16 (the measurements, their host and command:
# docs/measurements.md, bench/results/multi30k_bf16_vs_float32.json and
# translation_cpu_epoch.json).
AUTO_BF16_ON_NATIVE_CPU = True

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

logger = logging.getLogger(__name__)


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU feature flags the Linux kernel reports (a set of str).

    Empty on other systems, non-x86 CPUs or when ``cpuinfo`` cannot be read.

    Example:
    >>> isinstance(cpu_flags(), set)
    True
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16(cpuinfo="/proc/cpuinfo"):
    """True when the CPU computes bfloat16 dot products natively.

    Linux x86 only: ``avx512_bf16`` (Cooper Lake, Zen 4 and later) or
    ``amx_bf16`` (Sapphire Rapids and later) in ``/proc/cpuinfo``. False on
    every other system (no guessing).

    Example:
    >>> cpu_has_native_bf16() in (True, False)
    True
    """
    if platform.system() != "Linux" or platform.machine().lower() not in (
            "x86_64", "amd64"):
        return False
    return bool(cpu_flags(cpuinfo) & set(_BF16_FLAGS))


def resolve_precision(precision="auto", native_bf16=None, has_gpu=None,
                      auto_bf16=None, backend=None):
    """The Keras dtype policy name a job should use, and why.

    Args:
        precision: ``"auto"``, ``"float32"``, ``"mixed_bfloat16"`` or
            ``"mixed_float16"``. Anything but ``"auto"`` is returned as is.
        native_bf16: bool, whether the CPU has native bfloat16 (default:
            :func:`cpu_has_native_bf16`).
        has_gpu: bool, whether TensorFlow sees a GPU (default: asks it).
            ``"auto"`` never picks a 16-bit policy on a GPU; mixed_float16
            there is an explicit choice.
        auto_bf16: bool, whether ``"auto"`` may pick bfloat16 on a native
            bfloat16 CPU (default: ``AUTO_BF16_ON_NATIVE_CPU``).
        backend: the Keras backend (default: ``keras.backend.backend()``);
            ``"auto"`` is float32 under any but ``"tensorflow"``.

    Returns:
        ``(policy, reason)``: a name from ``POLICIES`` and a sentence.

    Raises:
        ValueError: ``precision`` not one of ``CHOICES``.

    Example:
    >>> resolve_precision("float32")[0]
    'float32'
    >>> resolve_precision("auto", native_bf16=True, has_gpu=False,
    ...                   auto_bf16=True, backend="tensorflow")[0]
    'mixed_bfloat16'
    >>> resolve_precision("auto", native_bf16=True, backend="jax")[0]
    'float32'
    >>> resolve_precision("auto", native_bf16=False, has_gpu=False)[0]
    'float32'
    """
    if precision not in CHOICES:
        raise ValueError(
            f"`precision` must be one of {', '.join(CHOICES)}, got "
            f"precision={precision!r}")
    if precision != "auto":
        return precision, "asked for"
    backend = backend or keras.backend.backend()
    if backend != "tensorflow":
        return "float32", (f"auto: float32 under {backend} (bfloat16 measured "
                           "only under TensorFlow)")
    if has_gpu is None:
        import tensorflow as tf

        has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if has_gpu:
        return "float32", "auto: GPU (mixed_float16 is an explicit choice)"
    if native_bf16 is None:
        native_bf16 = cpu_has_native_bf16()
    if not native_bf16:
        return "float32", "auto: the CPU has no native bfloat16"
    if auto_bf16 is None:
        auto_bf16 = AUTO_BF16_ON_NATIVE_CPU
    if auto_bf16:
        return "mixed_bfloat16", "auto: the CPU has native bfloat16"
    return "float32", ("auto: the CPU has native bfloat16, but bfloat16 "
                       "training turned off (AUTO_BF16_ON_NATIVE_CPU)")


def apply_precision(precision="auto", log=print):
    """Resolves ``precision`` and sets it as the global Keras dtype policy.

    Call before building the model (layers read the policy when they are
    created). ``KERAS_TRM_PRECISION`` in the environment, when set,
    overrides ``"auto"`` (never an explicit choice).

    Args:
        precision: see :func:`resolve_precision`.
        log: callable taking one str (default ``print``), or None.

    Returns:
        The policy name set (str).

    Raises:
        ValueError: unknown ``precision`` (or ``KERAS_TRM_PRECISION``).

    Example:
    >>> apply_precision("float32", log=None)
    'float32'
    >>> keras.config.dtype_policy().name
    'float32'
    """
    if precision == "auto" and os.environ.get("KERAS_TRM_PRECISION"):
        precision = os.environ["KERAS_TRM_PRECISION"]
    policy, reason = resolve_precision(precision)
    keras.mixed_precision.set_global_policy(policy)
    if log is not None:
        log(f"precision: {policy} ({reason}; CPU native bfloat16: "
            f"{cpu_has_native_bf16()})")
    return policy


def float32_copy(model):
    """The same functional model computing in float32, with the same weights.

    A model trained under ``mixed_bfloat16`` keeps float32 variables but
    casts them to bfloat16 at every use; for decoding that means casting
    every weight at every step, and on a CPU without native bfloat16
    emulated matmuls. Jobs therefore decode their test set and export with
    this copy: same float32 variables, float32 compute (portable and fast
    at any batch size). A model already all float32 is returned as is.

    Args:
        model: a functional ``keras.Model`` (e.g. from
            ``keras_trm.models.transformer``).

    Returns:
        A ``keras.Model``: a new one whose layers all use the ``"float32"``
        policy (input layers keep their dtypes), or ``model`` itself.

    Example:
    >>> import numpy as np
    >>> from keras_trm.models import transformer
    >>> keras.config.set_dtype_policy("mixed_bfloat16")
    >>> mixed = transformer(20, num_layers=1, d_model=8, num_heads=2, d_ff=8,
    ...                     max_sequence_length=8)
    >>> keras.config.set_dtype_policy("float32")
    >>> plain = float32_copy(mixed)
    >>> {layer.dtype_policy.name for layer in plain.layers[2:]}
    {'float32'}
    >>> all(np.array_equal(a, b) for a, b in zip(mixed.get_weights(),
    ...                                          plain.get_weights()))
    True
    """
    def is_input(layer):
        return isinstance(layer, keras.layers.InputLayer)

    if all(is_input(layer) or layer.dtype_policy.name == "float32"
           for layer in model.layers):
        return model

    from keras_trm.models.transformer import Transformer

    if isinstance(model, Transformer):  # rebuilt as the class (it decodes)
        copy = Transformer.from_config({**model.get_config(),
                                        "dtype": "float32"})
        copy.set_weights(model.get_weights())
        return copy

    def clone(layer):
        config = layer.get_config()
        if "dtype" in config and not is_input(layer):  # layers, not ops
            config["dtype"] = "float32"
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy
