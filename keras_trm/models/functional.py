"""A functional ``keras.Model`` whose integer inputs refuse other dtypes."""

import keras

from keras_trm.utils import checks as v


@keras.saving.register_keras_serializable(package="keras_trm")
class IntegerInputsModel(keras.Model):
    """A functional ``keras.Model`` that refuses non-integer ids.

    Built like ``keras.Model(inputs, outputs, name=...)``. A plain
    functional model casts every value to its ``keras.Input``'s dtype, so
    float token ids given to an int32 input are cut down silently (1.7 ->
    1). Before running the graph, this one checks that every value given
    for an integer input has an integer (or unsigned) dtype; other inputs
    and Python lists are converted as usual. Saved and loaded (``.keras``)
    like any functional model (``keras_trm`` must be imported). The
    classifiers (``ClassifierModel``), ``Transformer`` and
    ``vanilla_transformer_lm`` are such models.

    Raises (when called):
        TypeError: a float, bool or string value for an integer input; the
            message names the input and the dtype received.

    Example:

    >>> import numpy as np
    >>> ids = keras.Input((None,), dtype="int32", name="token_ids")
    >>> model = IntegerInputsModel(ids, keras.layers.Embedding(10, 4)(ids))
    >>> tuple(model(np.array([[1, 2]], "int32")).shape)
    (1, 2, 4)
    >>> model(np.array([[1.7, 2.0]], "float32"))
    Traceback (most recent call last):
    ...
    TypeError: ...`token_ids` must be integer token ids, got dtype float32...
    """

    def call(self, inputs, training=None, mask=None):
        v.integer_inputs(inputs, self.inputs)
        return super().call(inputs, training=training, mask=mask)



def check_stack(vocabulary_size, num_layers, d_model, num_heads, dropout_rate,
                attention_dropout_rate, layer_norm_epsilon):
    """The checks every Transformer stack's builder makes of its arguments
    (``transformer``, ``vanilla_transformer_lm``): ``ValueError`` or
    ``TypeError`` naming the argument and the value."""
    for name, value in (("vocabulary_size", vocabulary_size), ("num_layers", num_layers),
                        ("d_model", d_model), ("num_heads", num_heads)):
        v.positive_int(name, value)
    v.divisible("d_model", d_model, "num_heads", num_heads)
    v.rate("dropout_rate", dropout_rate)
    v.rate("attention_dropout_rate", attention_dropout_rate)
    v.positive_float("layer_norm_epsilon", layer_norm_epsilon)
