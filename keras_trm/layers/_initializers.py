"""One initializer instance per weight.

Keras 3 random initializers fix their seed when they are constructed, so one
unseeded instance called for several weights returns the same values every
time (W_Q = W_K = W_V). Every layer of keras_trm therefore gives each weight
its own clone, as ``keras.layers.MultiHeadAttention`` does.
"""

import keras


def clone_initializer(initializer, offset=0):
    """A fresh instance of ``initializer`` for one weight.

    An unseeded random initializer gets a new seed drawn from Keras' global
    seed (``keras.utils.set_random_seed`` makes it reproducible). A seeded one
    gets ``seed + offset``, so a layer that numbers its weights 0, 1, 2, ...
    still gives them distinct values while two layers built with the same
    seeded initializer are equal weight for weight. Non-random initializers
    and plain callables are returned as they are.

    Args:
        initializer: anything ``keras.initializers.get`` accepts.
        offset: int, the weight's number within its layer.

    Returns:
        A ``keras.initializers.Initializer`` (or the callable given).
    """
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    config = initializer.get_config()
    seed = config.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = seed + int(offset)
    return initializer.__class__.from_config(config)
