"""Mixed precision: which compute dtype a training job uses.

Keras mixed precision (Micikevicius et al. 2018) keeps float32 variables
and computes in a 16-bit type. On CPUs bfloat16 only pays with native
bfloat16 dot products (x86 ``avx512_bf16`` or ``amx_bf16``, where oneDNN
beats float32), and only under TensorFlow (under JAX, XLA's CPU backend
ran at 0.97x float32's tokens/s,
``bench/results/train_step_jax_cpu_bf16_vs_float32.json``): there
``"auto"`` picks ``"mixed_bfloat16"``, elsewhere float32.
``"mixed_float16"`` (GPUs) is only used when asked for.

Under a 16-bit policy, attention softmax, the tied output logits, the loss
and LayerNormalization statistics are computed in float32
(``tests/test_precision.py``). A model trained in bfloat16 also decodes
and exports in it (emulated, slow, on other CPUs): train with
``--precision float32`` for a model served on other CPUs.
"""

import os
import platform

import keras

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
CHOICES = ("auto",) + POLICIES

# "auto" turns bfloat16 on where it was measured to pay: >= 1.3x float32's
# tokens/s AND Multi30k BLEU within 0.5 of float32 on a native bfloat16 CPU
# (docs/measurements.md, bench/results/multi30k_bf16_vs_float32.json).
AUTO_BF16_ON_NATIVE_CPU = True


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU feature flags the Linux kernel reports (a set of str); empty
    on other systems, non-x86 CPUs or when ``cpuinfo`` cannot be read.

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
    """True when the CPU computes bfloat16 dot products natively: on Linux
    x86, ``avx512_bf16`` (Cooper Lake, Zen 4 and later) or ``amx_bf16``
    (Sapphire Rapids and later) in ``/proc/cpuinfo``; False elsewhere.

    Example:
    >>> cpu_has_native_bf16() in (True, False)
    True
    """
    if platform.system() != "Linux" or platform.machine().lower() not in (
            "x86_64", "amd64"):
        return False
    return bool(cpu_flags(cpuinfo) & {"avx512_bf16", "amx_bf16"})


def resolve_precision(precision="auto", native_bf16=None, has_gpu=None,
                      auto_bf16=None, backend=None):
    """The Keras dtype policy name a job should use, and why.

    Args:
        precision: ``"auto"``, ``"float32"``, ``"mixed_bfloat16"`` or
            ``"mixed_float16"``. Anything but ``"auto"`` is returned as is.
        native_bf16: bool (default: :func:`cpu_has_native_bf16`).
        has_gpu: bool, whether TensorFlow sees a GPU (default: asks it);
            ``"auto"`` never picks a 16-bit policy on a GPU.
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
    """Resolves ``precision`` and sets it as the global Keras dtype policy
    (call it before building the model). ``KERAS_TRM_PRECISION`` in the
    environment overrides ``"auto"`` (never an explicit choice).

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

    A ``mixed_bfloat16`` model casts its float32 variables at every use
    (emulated matmuls on CPUs without native bfloat16); jobs decode and
    export with this copy instead. A model already all float32 is returned
    as is.

    Args:
        model: a functional ``keras.Model`` (e.g. a ``transformer``).

    Returns:
        A new ``keras.Model`` whose layers (not inputs) use the
        ``"float32"`` policy, or ``model`` itself.

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
    from keras_trm.models.transformer import Transformer

    def is_input(layer):
        return isinstance(layer, keras.layers.InputLayer)

    def clone(layer):
        config = layer.get_config()
        if "dtype" in config and not is_input(layer):  # layers, not ops
            config["dtype"] = "float32"
        return layer.__class__.from_config(config)

    if all(is_input(layer) or layer.dtype_policy.name == "float32"
           for layer in model.layers):
        return model
    if isinstance(model, Transformer):  # rebuilt as the class (it decodes)
        copy = Transformer.from_config({**model.get_config(), "dtype": "float32"})
    else:
        copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy
