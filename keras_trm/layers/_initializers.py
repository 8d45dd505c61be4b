"""Helpers shared by the layers: one initializer instance per weight, and
the boilerplate of their ``get_config``/``build``.

Keras 3 random initializers fix their seed when they are constructed, so one
unseeded instance called for several weights returns the same values every
time (W_Q = W_K = W_V). Every layer of keras_trm therefore gives each weight
its own clone, as ``keras.layers.MultiHeadAttention`` does.
"""

import keras


def clone_initializer(initializer, offset=0):
    """A fresh instance of ``initializer`` for one weight.

    An unseeded random initializer gets a new seed drawn from Keras' global
    seed. A seeded one gets ``seed + offset`` (``offset``: the weight's
    number in its layer), so a layer's weights differ while two layers built
    with the same seeded initializer are equal weight for weight.
    Non-random initializers and plain callables are returned as they are.
    """
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    config = initializer.get_config()
    seed = config.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = seed + int(offset)
    return initializer.__class__.from_config(config)


def config_with(config, layer, names, initializers=()):
    """``config`` updated with ``layer``'s attributes ``names`` and its
    ``initializers`` serialized (a layer's ``get_config``)."""
    config.update({name: getattr(layer, name) for name in names})
    config.update({name: keras.initializers.serialize(getattr(layer, name))
                   for name in initializers})
    return config


def known_last_dim(name, shape):
    """``shape[-1]``, else ValueError when it is unknown."""
    if shape[-1] is None:
        raise ValueError(f"The last dimension of `{name}` must be known, "
                         f"got shape {tuple(shape)}")
    return shape[-1]
