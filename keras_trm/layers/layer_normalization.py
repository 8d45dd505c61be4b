"""Layer normalization (Ba, Kiros and Hinton 2016, Eq. 3-4).

Keras' own ``keras.layers.LayerNormalization`` computes exactly the paper's
statistics over the hidden units of one example, so keras_trm re-exports it:

    mu = (1/H) sum_i a_i,   sigma = sqrt((1/H) sum_i (a_i - mu)^2 + epsilon),
    LN(a) = gamma * (a - mu) / sigma + beta

Example:

>>> import numpy as np
>>> from keras_trm.layers import LayerNormalization
>>> a = np.array([[1.0, 2.0, 3.0, 4.0]], "float32")
>>> ln = LayerNormalization(epsilon=0.0)   # gamma = 1, beta = 0 at start
>>> bool(np.allclose(ln(a), (a - a.mean()) / a.std(), atol=1e-6))
True
"""

import keras

LayerNormalization = keras.layers.LayerNormalization
