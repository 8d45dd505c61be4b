"""Training on a GPU machine without TensorFlow (issue #39 item 3), end to
end on a few hundred real Multi30k pairs: ``prepare_translation`` (TF)
writes the portable files; the trainer runs under JAX in a child process
where TensorFlow cannot be imported (loss goes down; every file at most the
size limit; SHA-256s match); ``export_portable`` (TF) writes the SavedModel,
whose translations equal the JAX search on the same weights.

The numpy parts (pair files, token batches, weight files) are checked on
their own, without a model."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_trm.jobs import portable_files as pf

LIMIT = 24 * 1024  # bytes: small, so that files and weights are split

# Installed first in the child: every finder answers "not found" for these
# packages, as where they are not installed (``import tensorflow`` raises
# ModuleNotFoundError, ``importlib.util.find_spec`` gives None).
BLOCKER = textwrap.dedent("""
    import sys

    BLOCKED = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "tf_keras")

    class _Hidden:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                return None
            find = getattr(self.finder, "find_spec", None)
            return None if find is None else find(name, path, target)

        def __getattr__(self, attr):
            return getattr(self.finder, attr)

    sys.meta_path[:] = [_Hidden(f) for f in sys.meta_path]
""")

# The child: `python -m keras_trm.jobs.portable_training ...` (runpy), then
# the JAX greedy search on the written weights, then the import of a
# TensorFlow job (which must fail with the install hint).
CHILD = BLOCKER + textwrap.dedent("""
    import json, runpy
    sys.argv = ["portable_training"] + json.loads(sys.argv[1])
    out = sys.argv.pop()
    try:
        runpy.run_module("keras_trm.jobs.portable_training", run_name="__main__",
                         alter_sys=True)
    except SystemExit as exit:
        assert exit.code in (0, None), exit.code
    import keras, numpy as np
    from keras_trm.decoding.search import greedy_search
    from keras_trm.jobs import portable_training as pt
    workdir = sys.argv[sys.argv.index("--workdir") + 1]
    prepared = sys.argv[sys.argv.index("--prepared") + 1]
    model = pt.load_portable_model(workdir + "/weights")
    sources = pt.load_pairs(prepared, "validation").padded_sources()
    np.save(out + "/greedy_ids.npy",
            keras.ops.convert_to_numpy(greedy_search(model, sources)))
    try:
        import keras_trm.jobs.translation
        hint = None
    except ImportError as error:
        hint = str(error)
    json.dump({"backend": keras.backend.backend(), "job_import_error": hint,
               "tensorflow_modules": sorted(m for m in sys.modules
                                            if m.partition(".")[0] in BLOCKED)},
              open(out + "/child.json", "w"))
""")


@pytest.fixture(scope="module")
def prepared(data_dir, tmp_path_factory):
    from keras_trm.jobs.portable_tensorflow import prepare_translation
    from keras_trm.jobs.translation import TranslationConfig

    root = tmp_path_factory.mktemp("portable")
    config = TranslationConfig(
        limit=300, validation_limit=24, vocabulary="wordpiece",  # 24 KiB files
        vocabulary_size=1000, num_layers=1,
        d_model=32, num_heads=2, d_ff=64, max_sequence_length=96,
        max_train_length=64, warmup_steps=30, tokens_per_batch=1024, epochs=4,
        average_last=3, model_name="tiny_portable", download=False)
    manifest = prepare_translation(config, data_dir, root / "work", root / "prepared",
                                   max_file_mib=LIMIT / 2**20)
    return root, manifest


@pytest.fixture(scope="module")
def trained(prepared):
    root, _ = prepared
    args = ["--prepared", str(root / "prepared"), "--workdir", str(root / "run"),
            "--boundaries", "64", "--precision", "float32",
            "--max-file-mib", str(LIMIT / 2**20), str(root)]
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], env=env,
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    return root, json.loads((root / "child.json").read_text()), child.stdout


def _all_files_within_limit_and_listed(folder, listed):
    for name, entry in listed.items():
        path = folder / name
        assert path.stat().st_size == entry["bytes"] <= LIMIT, name
        assert pf.sha256_file(path) == entry["sha256"], name


def test_prepare_writes_split_npz_files_with_the_jobs_ids(prepared, data_dir):
    from keras_trm.data import load_multi30k
    from keras_trm.text import TextTokenizer, load_vocabulary

    root, manifest = prepared
    folder = root / "prepared"
    assert manifest["model"]["vocabulary_size"] == manifest["vocabulary"]["size"]
    assert manifest["special_ids"] == {"pad": 0, "unk": 1, "start": 2, "end": 3}
    train = manifest["splits"]["train"]
    assert len(train["files"]) >= 2  # a few hundred pairs over the 24 KiB limit
    _all_files_within_limit_and_listed(folder, manifest["files"])
    assert set(manifest["files"]) >= {"val.source.txt", "val.target.txt",
                                      "test.source.txt", manifest["vocabulary"]["file"]}
    pairs = pf.load_pairs(folder, "train")
    assert len(pairs) == train["pairs"] == sum(f["pairs"] for f in train["files"])
    assert train["corpora"]["train"]["lines"] == 300
    # The ids are the job's: source ids + END, START + target ids + END.
    tokenizer = TextTokenizer(load_vocabulary(folder / manifest["vocabulary"]["file"]))
    src, tgt = load_multi30k("train", data_dir)  # the first pair is kept (short)
    expected_source = tokenizer.tokenize([src[0]])[0].numpy().tolist() + [3]
    expected_target = [2] + tokenizer.tokenize([tgt[0]])[0].numpy().tolist() + [3]
    assert pairs.source_ids(0).tolist() == expected_source
    assert pairs.target_ids(0).tolist() == expected_target
    # Val: every pair fits the model's 96 positions, so row i is line i.
    validation = manifest["splits"]["validation"]
    assert validation["pairs"] == validation["lines"] == 24


def test_a_changed_file_is_refused(prepared, tmp_path):
    import shutil

    root, manifest = prepared
    copy = tmp_path / "copy"
    shutil.copytree(root / "prepared", copy)
    pf.read_prepared(copy)  # intact
    with open(copy / "val.target.txt", "a", encoding="utf-8") as f:
        f.write("x\n")
    with pytest.raises(ValueError, match="val.target.txt has .* bytes, the manifest says"):
        pf.read_prepared(copy)
    (copy / "val.target.txt").unlink()
    with pytest.raises(FileNotFoundError, match="val.target.txt is missing"):
        pf.read_prepared(copy)


def test_trains_under_jax_without_tensorflow(trained):
    root, child, stdout = trained
    assert child["backend"] == "jax"
    assert child["tensorflow_modules"] == []
    assert "needs TensorFlow" in child["job_import_error"]
    result = json.loads((root / "run" / "result.json").read_text())
    log = result["epochs_log"]
    assert result["epochs"] == len(log) == 4
    assert log[-1]["token_loss"] < log[0]["token_loss"] - 0.5
    assert log[-1]["val_token_loss"] < log[0]["val_token_loss"] - 0.3
    assert result["val_token_loss_by_epoch"] == [e["val_token_loss"] for e in log]
    by_k = {int(k): x for k, x in result["val_token_loss_by_average"].items()}
    assert sorted(by_k) == [1, 2, 3]
    assert by_k[result["averaged_checkpoints"]] == min(by_k.values())
    assert by_k[1] == pytest.approx(log[-1]["val_token_loss"], abs=1e-4)
    # The job's stages (PortableTrainingRun), timed; the report writes this.
    assert list(result["stage_seconds"]) == [
        "setup", "prepare_data", "build", "fit", "select_average", "export"]
    assert all(s >= 0 for s in result["stage_seconds"].values())
    # The weights: several files (the embedding split over two), each <=
    # the limit, sizes and SHA-256 as listed; result.json beside them.
    weights = root / "run" / "weights"
    info = json.loads((weights / "weights.json").read_text())
    assert len(info["files"]) >= 3
    assert max(len(w["parts"]) for w in info["weights"]) >= 2
    _all_files_within_limit_and_listed(weights, info["files"])
    assert all(p.stat().st_size <= LIMIT for p in weights.iterdir())
    assert info["model"]["name"] == "tiny_portable"
    assert '"val_token_loss"' in stdout


def test_savedmodel_translates_as_the_jax_search(prepared, trained, tmp_path):
    """Round trip across backends: JAX trains and searches; TensorFlow
    exports; the SavedModel's greedy translations of val are those of the
    JAX search on the same weights (ids detokenized here)."""
    import tensorflow as tf

    from keras_trm.jobs.portable_tensorflow import (
        export_portable, prepared_config, read_lines, translate_with_saved_model)
    from keras_trm.jobs.translation import prepare_tokenizer

    root, manifest = prepared
    result = export_portable(root / "prepared", root / "run" / "weights",
                             tmp_path / "export", beam_size=1)
    path = pathlib.Path(result["export"])
    assert path.parent.name == "tiny_portable" and (path / "saved_model.pb").is_file()
    assert result["validation"]["sentences"] == 24
    assert 0.0 <= result["validation"]["bleu"] <= 100.0
    assert json.loads((root / "run" / "weights" / "export_result.json").read_text()) == result

    sources = read_lines(root / "prepared" / "val.source.txt")
    served = translate_with_saved_model(path, sources)
    tokenizer = prepare_tokenizer(prepared_config(manifest), [], root / "prepared")
    ids = np.load(root / "greedy_ids.npy")
    searched = [t.decode("utf-8") for t in tokenizer.detokenize(
        tf.constant(ids, tf.int32)).numpy()]
    assert served == searched
    assert len(set(served)) > 1  # not one sentence repeated
    assert read_lines(root / "run" / "weights" / "val.hyp.de") == served


# --- the numpy parts, without a model ------------------------------------------


def _random_pairs(rng, n, longest=30):
    ns = rng.integers(2, longest, n)
    nt = rng.integers(3, longest + 1, n)
    source = rng.integers(4, 100, ns.sum()).astype(np.int32)
    target = rng.integers(4, 100, nt.sum()).astype(np.int32)
    return source, ns, target, nt


def test_pair_files_round_trip_within_the_size_limit(tmp_path, rng):
    writer = pf.PairWriter(tmp_path, "train", max_bytes=16 * 1024)
    chunks = [_random_pairs(rng, n) for n in (700, 3, 1200)]
    for chunk in chunks:
        writer.add(*chunk)
    files = writer.close()
    assert len(files) >= 5
    assert all((tmp_path / f["file"]).stat().st_size == f["bytes"] <= 16 * 1024
               for f in files)
    pairs = pf.load_pairs_files(tmp_path, [f["file"] for f in files])
    assert len(pairs) == 1903
    source = np.concatenate([c[0] for c in chunks])
    target = np.concatenate([c[2] for c in chunks])
    assert np.array_equal(pairs.source, source) and np.array_equal(pairs.target, target)
    assert np.array_equal(pairs.source_lengths(), np.concatenate([c[1] for c in chunks]))
    with pytest.raises(ValueError, match="lengths do not match"):
        writer.add(source[:5], [2, 2], target[:4], [2, 2])


def test_token_batches_hold_every_pair_once_in_static_shapes(rng):
    source, ns, target, nt = _random_pairs(rng, 500)
    pairs = pf.Pairs(source, np.concatenate([[0], np.cumsum(ns)]),
                     target, np.concatenate([[0], np.cumsum(nt)]))
    batches = pf.TokenBatches(pairs, tokens_per_batch=256, boundaries=(8, 16, 32),
                              seed=3)
    epoch = list(batches.epoch(0))
    assert len(epoch) == batches.batches_per_epoch
    assert {x["encoder_tokens"].shape for x, _ in epoch} == set(batches.shapes)
    assert all(x["encoder_tokens"].size <= 256 for x, _ in epoch)
    # Every pair's source once (rows are identified by their ids).
    rows = sorted(tuple(r[r != 0]) for x, _ in epoch for r in x["encoder_tokens"]
                  if r.any())
    assert rows == sorted(tuple(pairs.source_ids(i)) for i in range(len(pairs)))
    labels = sum(int((y != 0).sum()) for _, y in epoch)
    assert labels == int(nt.sum() - len(nt))
    # Decoder input and labels are the target shifted by one.
    x, y = epoch[0]
    row = int(np.argmax(x["decoder_tokens"][:, 0] != 0))
    n = int((y[row] != 0).sum())
    assert np.array_equal(x["decoder_tokens"][row, 1:n], y[row, :n - 1])
    # Seeded: the same epoch again, another order next epoch; a stream
    # resumed at (epoch, skip) gives the uninterrupted batches.
    again = list(batches.epoch(0))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(epoch, again))
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(epoch, batches.epoch(1)))
    stream = batches.stream(0, skip=len(epoch) - 2)
    tail = [next(stream) for _ in range(3)]
    assert np.array_equal(tail[0][1], epoch[-2][1])
    assert np.array_equal(tail[2][1], next(batches.epoch(1))[1])
    with pytest.raises(ValueError, match="more than the last of `boundaries`"):
        pf.TokenBatches(pairs, 256, (8, 16))


def test_weight_files_split_large_weights_and_refuse_nan(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Embedding(5000, 8),
                              keras.layers.Dense(4)])
    info = pf.write_weights(model, tmp_path / "f32", "float32", max_bytes=32 * 1024)
    embedding = info["weights"][0]
    assert embedding["shape"] == [5000, 8] and len(embedding["parts"]) >= 5
    assert all(p.stat().st_size <= 32 * 1024
               for p in (tmp_path / "f32").glob("weights-*.npz"))
    arrays, _ = pf.read_weights(tmp_path / "f32")
    assert all(np.array_equal(a, w) for a, w in zip(arrays, model.get_weights()))
    info = pf.write_weights(model, tmp_path / "bf16", "bfloat16", max_bytes=32 * 1024)
    assert sum(f["bytes"] for f in info["files"].values()) < 100_000
    arrays, _ = pf.read_weights(tmp_path / "bf16")
    for a, w in zip(arrays, model.get_weights()):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, w, rtol=2**-8, atol=0)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Embedding(5000, 8),
                              keras.layers.Dense(5)])
    with pytest.raises(ValueError, match=r"has shape \(8, 4\)"):
        pf.load_weights(other, tmp_path / "f32")
    model.layers[1].kernel.assign(np.full((8, 4), np.nan, "float32"))
    with pytest.raises(ValueError, match="holds NaN or inf"):
        pf.write_weights(model, tmp_path / "nan")


def test_train_portable_names_a_missing_prepared_folder(tmp_path, capsys):
    from keras_trm import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train-portable", "--prepared", str(tmp_path / "none"),
                  "--workdir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "prepare-translation" in err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train-portable", "--prepared", str(tmp_path), "--max-file-mib", "0"])
    assert exit_info.value.code == 2 and "max_file_mib" in capsys.readouterr().err


def test_recipe_reads_folders_prepared_before_weight_decay():
    """A manifest written before ``weight_decay`` existed trains with none
    (the value those folders were prepared for); the flag overrides it."""
    from keras_trm.jobs import portable_training as pt

    old = {"config": {k: 1 for k in pt.RECIPE_FIELDS if k != "weight_decay"}}
    assert pt.recipe(pt.PortableTrainingConfig(), old)["weight_decay"] == 0.0
    given = pt.PortableTrainingConfig(weight_decay=0.01)
    assert pt.recipe(given, old)["weight_decay"] == 0.01
    assert pt.recipe(pt.PortableTrainingConfig(),
                     {"config": {k: 0.5 for k in pt.RECIPE_FIELDS}})["weight_decay"] == 0.5
    with pytest.raises(ValueError, match="weight_decay=-1"):
        pt.PortableTrainingConfig(weight_decay=-1.0).validate()
