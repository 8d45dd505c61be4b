"""Layer normalization (Ba, Kiros and Hinton 2016, Eq. 3-4).

Keras' own ``keras.layers.LayerNormalization`` computes exactly the paper's
statistics over the hidden units of one example,

    mu = (1/H) sum_i a_i,   sigma = sqrt((1/H) sum_i (a_i - mu)^2 + epsilon),
    LN(a) = gamma * (a - mu) / sigma + beta,

so keras_trm re-exports it (``tests/test_layers.py`` checks it against the
formula) instead of writing it again.
"""

import keras

LayerNormalization = keras.layers.LayerNormalization
