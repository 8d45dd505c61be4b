"""One measurement of ``bench/ab.py`` in a child process that imports the
``keras_trm`` of one revision's tree (``PYTHONPATH=<tree>``; run as a file,
so neither this folder nor the current one shadows it):

    PYTHONPATH=<tree> python bench/ab_child.py train_step '{"steps": 30, ...}'

Prints one JSON line: the figures, and ``keras_trm``: the file imported.
"""

import json
import sys
import time

import keras
import numpy as np

import keras_trm


def random_sources(batch, vocabulary_size=8000, seed=0):
    """int32 ``(batch, longest)`` source ids for the searches: 6 to 25 tokens
    per row (random ids >= 4, END = 3 last, PAD = 0 after)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, 26, batch)
    source = np.zeros((batch, int(lengths.max())), "int32")
    for row, n in enumerate(lengths):
        source[row, :n - 1] = rng.integers(4, vocabulary_size, n - 1)
        source[row, n - 1] = 3
    return source


def train_step(steps, warmup, batch, length, vocabulary, precision, part):
    """Target tokens/s of ``transformer_small``'s ``train_on_batch`` (paper
    recipe, dropout 0.1) on seeded synthetic tokens; or, ``part="loss"``,
    of ``LabelSmoothedCrossEntropy``'s value and gradient on random
    ``(batch, length, vocabulary)`` logits in the compute dtype."""
    from keras_trm.models import transformer_small
    from keras_trm.training import LabelSmoothedCrossEntropy, NoamSchedule, paper_adam

    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    src = rng.integers(4, vocabulary, (batch, length)).astype("int32")
    tgt = rng.integers(4, vocabulary, (batch, length + 1)).astype("int32")
    peak_mib = grad_sum = None
    loss_fn = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    backend = keras.backend.backend()
    if part == "step":
        # Dropout pinned: the preset's default went from 0.1 to 0.3 on
        # 2026-11-28, and both revisions must build the same model.
        model = transformer_small(vocabulary, max_sequence_length=128, dropout_rate=0.1)
        model.compile(optimizer=paper_adam(NoamSchedule(d_model=256, warmup_steps=400)),
                      loss=loss_fn)
        x = {"encoder_tokens": src, "decoder_tokens": tgt[:, :-1]}

        def run():
            return model.train_on_batch(x, tgt[:, 1:])
    else:  # the loss alone: value and gradient, synced
        dtype = keras.mixed_precision.global_policy().compute_dtype
        logits = keras.ops.convert_to_tensor(
            rng.normal(size=(batch, length, vocabulary)).astype("float32"), dtype=dtype)
        labels = keras.ops.convert_to_tensor(tgt[:, 1:])
        if backend == "tensorflow":
            import tensorflow as tf

            @tf.function
            def value_and_grad(z):
                with tf.GradientTape() as tape:
                    tape.watch(z)
                    value = loss_fn(labels, z)
                return value, tape.gradient(value, z)
        elif backend == "jax":
            import jax
            value_and_grad = jax.jit(jax.value_and_grad(lambda z: loss_fn(labels, z)))
            peak_mib = value_and_grad.lower(logits).compile().memory_analysis(
                ).temp_size_in_bytes / 2**20
        else:
            def value_and_grad(z):
                z = z.detach().requires_grad_(True)
                value = loss_fn(labels, z)
                value.backward()
                return value.detach(), z.grad

        def run():
            nonlocal grad_sum
            value, grad = value_and_grad(logits)
            grad_sum = float(np.abs(keras.ops.convert_to_numpy(
                keras.ops.cast(grad, "float32")).astype("float64")).sum())
            return float(keras.ops.convert_to_numpy(value))
    for _ in range(warmup):
        run()
    if backend == "tensorflow":  # peak of live tensors in TF's CPU allocator
        import tensorflow as tf
        tf.config.experimental.reset_memory_stats("CPU:0")
    start = time.perf_counter()
    for _ in range(steps):
        loss = run()
    seconds = time.perf_counter() - start
    if backend == "tensorflow":
        peak_mib = tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20
    return {"tokens_per_second": steps * batch * length / seconds,
            "ms": 1000 * seconds / steps, "peak_tensor_mib": peak_mib,
            "grad_abs_sum": grad_sum, "loss": float(loss)}


def _beam4_and_greedy(module, max_length):
    """Beam 4 and greedy of a ``keras_trm.decoding.search`` module, as
    ``f(model, ids)``: its strategy objects, or the functions before them
    (issue #62)."""
    if hasattr(module, "BeamSearch"):
        return (module.BeamSearch(beam_size=4, max_decoding_length=max_length),
                module.GreedySearch(max_decoding_length=max_length))
    return (lambda model, ids: module.beam_search(
                model, ids, beam_size=4, max_decoding_length=max_length),
            lambda model, ids: module.greedy_search(
                model, ids, max_decoding_length=max_length))


def search(a_search, batch, max_length, repeats):
    """Seconds of the graph searches (``tf.function``, greedy and beam 4) of
    this tree (b) and of the ``search.py`` at ``a_search`` (a), on the same
    random-weight ``transformer_small`` (8,000 ids) and batch, the two taking
    turns call by call; and whether they give the same ids."""
    import importlib.util

    import tensorflow as tf

    from keras_trm.decoding import search as b_module
    from keras_trm.models import transformer_small

    spec = importlib.util.spec_from_file_location("a_search", a_search)
    a_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(a_module)
    keras.utils.set_random_seed(0)
    model = transformer_small(8000, max_sequence_length=128)
    source = tf.constant(random_sources(batch))
    searches = {}
    for name, module in (("a", a_module), ("b", b_module)):
        beam4, greedy = _beam4_and_greedy(module, max_length)
        searches[name] = {
            "beam4": tf.function(lambda ids, f=beam4: f(model, ids)),
            "greedy": tf.function(lambda ids, f=greedy: f(model, ids))}
    ids = {name: {kind: f(source).numpy() for kind, f in fs.items()}
           for name, fs in searches.items()}  # traced and warmed
    seconds = {name: {"beam4": [], "greedy": []} for name in searches}
    for repeat in range(repeats):
        for kind in ("beam4", "greedy"):
            for name in ("a", "b") if repeat % 2 == 0 else ("b", "a"):
                start = time.perf_counter()
                searches[name][kind](source).numpy()
                seconds[name][kind].append(time.perf_counter() - start)
    return {"seconds": seconds, "tensorflow": tf.__version__,
            "same_ids": {kind: bool(np.array_equal(ids["a"][kind], ids["b"][kind]))
                         for kind in ("beam4", "greedy")}}


def search_tree(batch, max_length, repeats, weights, save_weights=False):
    """Seconds of this tree's graph searches (``tf.function``, greedy and
    beam 4), layers included, on the ``search`` kind's model and batch, and
    the sha1 of their ids. ``save_weights``: only write the model's
    weights (seed 0) to ``weights``; otherwise read them from there, so that
    both trees decode with the same weights (an older layout is read by a
    newer tree; initial weights drawn in another order would not be)."""
    import hashlib

    import tensorflow as tf

    from keras_trm.decoding import search
    from keras_trm.models import transformer_small

    keras.utils.set_random_seed(0)
    model = transformer_small(8000, max_sequence_length=128)
    if save_weights:
        model.save_weights(weights)
        return {"saved": weights}
    model.load_weights(weights)
    source = tf.constant(random_sources(batch))
    beam4, greedy = _beam4_and_greedy(search, max_length)
    searches = {"beam4": tf.function(lambda ids: beam4(model, ids)),
                "greedy": tf.function(lambda ids: greedy(model, ids))}
    ids_sha1 = {kind: hashlib.sha1(f(source).numpy().tobytes()).hexdigest()
                for kind, f in searches.items()}  # traced and warmed
    seconds = {kind: [] for kind in searches}
    for _ in range(repeats):
        for kind, f in searches.items():
            start = time.perf_counter()
            f(source).numpy()
            seconds[kind].append(time.perf_counter() - start)
    return {"seconds": seconds, "ids_sha1": ids_sha1,
            "tensorflow": tf.__version__}


def job_epoch(workdir, epochs, flags):
    """The translation job's training input and model as ``keras-trm
    train-translation`` builds them (its stages up to ``build``, the
    default config plus ``flags``), then ``fit`` for ``epochs`` epochs;
    wall seconds of each epoch. Before issue #61 the input was a tf.data
    stream of TFRecord shards (``stream["dataset"]``), since then the
    TokenBatches (behind a thin ``tf_dataset`` on TensorFlow)."""
    from keras_trm.cli import config_parser, parse_config
    from keras_trm.jobs import translation

    parser = config_parser("ab", "", translation.TranslationConfig, workdir)
    config, args = parse_config(parser, translation.TranslationConfig, flags)
    run = translation.TranslationRun(config, None, workdir, "/nonexistent", ())
    for stage in ("check", "prepare_data", "build"):
        getattr(run, stage)()
    stream = run.stream
    if "dataset" in stream:
        train, steps = stream["dataset"], stream["steps_per_epoch"]
    else:  # the job's own rule: TokenBatches as they are, tf.data on TensorFlow
        train, steps = stream["batches"], stream["steps_per_epoch"]
        if keras.backend.backend() == "tensorflow":
            train = translation.tf_dataset(train)
    seconds = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.t)

    history = run.model.fit(train, epochs=epochs, steps_per_epoch=steps,
                            callbacks=[Clock()], verbose=0, shuffle=False)
    return {"epoch_seconds": seconds, "steps_per_epoch": steps,
            "loss": [float(x) for x in history.history["loss"]]}


if __name__ == "__main__":
    kind, options = sys.argv[1], json.loads(sys.argv[2])
    result = {"train_step": train_step, "search": search,
              "search_tree": search_tree, "job_epoch": job_epoch}[kind](**options)
    print(json.dumps(dict(result, keras_trm=keras_trm.__file__)))
