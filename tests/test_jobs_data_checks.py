"""The jobs' data checks: copies reused only for the data they came from,
bad configurations refused, failed downloads leave nothing behind.
(Prepared folders' own checks: test_prepared.py.)"""

import gzip
import os

import pytest

from keras_trm.jobs import translation

pytestmark = pytest.mark.portable  # CI runs it under each backend


def _read(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_limit_copies_follow_the_direction_and_the_data(data_dir, tmp_path):
    """``limit`` copies of the training corpora are named by language and
    keyed to their source files: a second run in the same work folder in
    the other direction, or on other files, gets its own text."""
    from keras_trm.data import load_multi30k

    work = tmp_path / "work"
    en_de = translation.TranslationConfig(limit=5)
    data = translation.resolve_translation_data(en_de, data_dir, work)
    src, tgt = load_multi30k("train", data_dir)
    (_, source, target), = data.corpora
    assert (_read(source), _read(target)) == (src[:5], tgt[:5])
    de_en = translation.TranslationConfig(limit=5, source_language="de",
                                          target_language="en")
    data = translation.resolve_translation_data(de_en, data_dir, work)
    (_, source, target), = data.corpora
    assert (_read(source), _read(target)) == (tgt[:5], src[:5])
    assert data.validation[0][0] == load_multi30k("val", data_dir)[1][0]

    # dataset=files: the same corpus name, other files (a data folder moved)
    def files(folder, words):
        folder.mkdir()
        paths = {}
        for split in ("train", "val"):
            for lang, word in zip(("en", "de"), words):
                path = folder / f"{split}.{lang}"
                path.write_text("".join(f"{word} {i}\n" for i in range(8)))
                paths[f"{split}.{lang}"] = str(path)
        return dict(dataset="files", limit=5, download=False,
                    train_source=paths["train.en"], train_target=paths["train.de"],
                    validation_source=paths["val.en"],
                    validation_target=paths["val.de"])

    for folder, words in (("a", ("one", "eins")), ("b", ("two", "zwei"))):
        config = translation.TranslationConfig(**files(tmp_path / folder, words))
        (_, source, target), = translation.resolve_translation_data(
            config, None, work / "files").corpora
        assert _read(source) == [f"{words[0]} {i}" for i in range(5)]
        assert _read(target) == [f"{words[1]} {i}" for i in range(5)]
    # the same file changed in place (size, modification time): copied again
    path = tmp_path / "b" / "train.en"
    path.write_text("".join(f"three {i}\n" for i in range(9)))
    os.utime(path, ns=(1, 1))
    (_, source, _), = translation.resolve_translation_data(
        config, None, work / "files").corpora
    assert _read(source) == [f"three {i}" for i in range(5)]


def _refused(config, *words):
    import pytest

    with pytest.raises((ValueError, TypeError)) as info:
        config.validate()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_translation_config_refuses_what_it_used_to_misread():
    T = translation.TranslationConfig
    for kwargs, words in [
            (dict(jit_compile="yes"), ("jit_compile", "'yes'")),
            (dict(jit_compile=True), ("jit_compile", "True")),
            (dict(tensorboard=True), ("tensorboard", "True")),
            (dict(tensorboard="yes"), ("tensorboard", "'yes'")),
            (dict(download="no"), ("download", "'no'")),
            (dict(source_language="en", target_language="en"),
             ("source_language", "target_language", "differ")),
            (dict(source_language="../x"), ("source_language", "'../x'")),
            (dict(model_name="../../evil"), ("model_name", "'../../evil'")),
            (dict(model_name=""), ("model_name",)),
            (dict(model_name=".."), ("model_name",)),
            (dict(length_penalty=float("inf")), ("length_penalty", "inf")),
            (dict(length_penalty="1"), ("length_penalty", "'1'")),
            (dict(checkpoint_every_minutes=float("inf")),
             ("checkpoint_every_minutes", "inf")),
            (dict(train_weights="1,x"), ("train_weights", "'1,x'")),
            (dict(train_weights="1,inf"), ("train_weights",)),
    ]:
        _refused(T(**kwargs), *words)
    T(source_language="de", target_language="en", model_name="my_model",
      train_weights="1,3", length_penalty=0, tensorboard="off",
      jit_compile="auto", download=False).validate()


def test_classifier_and_lm_configs_refuse_strings_for_tuples_and_bools():
    from keras_trm.jobs import imdb, language_model, mnist

    M, I, L = mnist.MnistConfig, imdb.ImdbConfig, language_model.LanguageModelConfig
    for config, words in [
            (M(jit_compile="off"), ("jit_compile", "'off'")),
            (M(download="no"), ("download",)),
            (M(norms=()), ("norms", "()")),
            (M(batch_sizes=()), ("batch_sizes",)),
            (M(norms="batch"), ("norms", "'batch'")),
            (M(batch_sizes=8), ("batch_sizes", "8")),
            (M(norms=("batch", "group")), ("norms", "'group'")),
            (M(batch_sizes=(8, 0)), ("batch_sizes", "0")),
            (I(jit_compile="yes"), ("jit_compile", "'yes'")),
            (I(jit_compile=False), ("jit_compile", "False")),
            (I(models=()), ("models",)),
            (I(models="encoder"), ("models", "'encoder'")),
            (I(download="no"), ("download",)),
            (L(d_model=130, num_heads=4), ("d_model", "num_heads")),
            (L(match_parameters="no"), ("match_parameters",)),
            (L(model_name="a/b"), ("model_name",)),
    ]:
        _refused(config, *words)
    M(norms=["layer"], batch_sizes=[64], jit_compile=False).validate()
    I(models=("lstm",), jit_compile="on").validate()
    L(model_name="").validate()


def test_cli_still_passes_its_bools_and_choices():
    from keras_trm import cli
    from keras_trm.jobs import imdb, mnist

    def parse(cls, argv):
        parser = cli.config_parser("x", "d", cls, "w", results_dir=False)
        return cli.parse_config(parser, cls, argv)[0]

    config = parse(translation.TranslationConfig,
                   ["--tensorboard", "off", "--jit_compile", "on", "--download", "false"])
    assert (config.tensorboard, config.jit_compile, config.download) == ("off", "on", False)
    config = parse(mnist.MnistConfig, ["--jit_compile", "false", "--norms", "batch",
                                       "--batch_sizes", "8"])
    assert (config.jit_compile, config.norms, config.batch_sizes) == (False, ("batch",), (8,))
    config = parse(imdb.ImdbConfig, ["--jit_compile", "off", "--models", "encoder,lstm"])
    assert (config.jit_compile, config.models) == ("off", ("encoder", "lstm"))


def _gz(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data))
    return path


def _damaged(path, how):
    """``path`` (a .gz) cut short, or not gzip at all."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2] if how == "truncated" else b"plain text\n")


def test_damaged_imdb_mnist_ptb_files_are_named(tmp_path):
    import numpy as np
    import pytest

    from keras_trm.data import CorpusError, load_imdb, load_mnist, load_ptb

    for how in ("truncated", "not gzip"):
        root = tmp_path / how.replace(" ", "_")
        review = b'{"text": "a good film", "label": 1}\n'
        for split in ("train", "test"):
            _gz(root / "imdb" / f"imdb_{split}.jsonl.gz", review * 3000)
        _damaged(root / "imdb" / "imdb_train.jsonl.gz", how)
        with pytest.raises(CorpusError, match="imdb_train.jsonl.gz"):
            load_imdb("train", root)
        header = np.array([2051, 100, 28, 28], ">i4").tobytes()
        rng = np.random.default_rng(0)
        _gz(root / "mnist" / "t10k-images-idx3-ubyte.gz",
            header + rng.integers(0, 255, 100 * 28 * 28, dtype=np.uint8).tobytes())
        _gz(root / "mnist" / "t10k-labels-idx1-ubyte.gz",
            np.array([2049, 100], ">i4").tobytes() + bytes(100))
        _damaged(root / "mnist" / "t10k-images-idx3-ubyte.gz", how)
        with pytest.raises(CorpusError, match="t10k-images-idx3-ubyte.gz"):
            load_mnist("test", root)
        _gz(root / "ptb" / "ptb.valid.txt.gz", b" the cat sat\n" * 5000)
        _damaged(root / "ptb" / "ptb.valid.txt.gz", how)
        with pytest.raises(CorpusError, match="ptb.valid.txt.gz"):
            list(load_ptb("valid", root))


def test_malformed_or_empty_corpora_are_refused_naming_the_file(tmp_path):
    import pytest

    from keras_trm.data import (
        CorpusError, load_imdb, load_ptb, load_tiny_shakespeare)

    good = b'{"text": "fine", "label": 0}\n'
    path = tmp_path / "imdb" / "imdb_train.jsonl.gz"
    for body, words in [
            (good + b"\n" + good + b'{"text": "cut\n', ("line 4", "JSON")),
            (good + b"[1, 2]\n", ("line 2", "object")),
            (good + b'{"text": "x", "label": true}\n', ("line 2", "label")),
            (b"", ("no review",)),
            (b"\n\n", ("no review",))]:
        _gz(path, body)
        with pytest.raises(CorpusError) as info:
            load_imdb("train", tmp_path)
        assert all(w in str(info.value) for w in (str(path), *words)), str(info.value)

    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.test.txt").write_text("\n \n\n")
    with pytest.raises(CorpusError, match=r"ptb\.test\.txt.*no word"):
        list(load_ptb("test", tmp_path))

    shakespeare = tmp_path / "tinyshakespeare" / "input.txt"
    shakespeare.parent.mkdir()
    shakespeare.write_bytes(b"First Citizen:\nBefore \xff we proceed\n")
    with pytest.raises(CorpusError, match=r"input\.txt.*UTF-8.*line 2"):
        load_tiny_shakespeare("train", tmp_path)
    for text in ("", "abc"):
        shakespeare.write_text(text)
        with pytest.raises(CorpusError, match=r"input\.txt.*empty"):
            load_tiny_shakespeare("valid", tmp_path)
    shakespeare.write_text("To be, or not to be\r\n" * 50)
    assert "\r" not in load_tiny_shakespeare("train", tmp_path)


def test_imdb_limit_on_a_smaller_dataset(tmp_path):
    """``limit`` samples each split by its own size (a copy smaller than
    25,000 reviews gave an IndexError); the full-size choice is kept."""
    import numpy as np

    from keras_trm.jobs import imdb

    for split, n in (("train", 300), ("test", 200)):
        body = "".join(f'{{"text": "{split} review {i}", "label": {i % 2}}}\n'
                       for i in range(n)).encode()
        _gz(tmp_path / "data" / "imdb" / f"imdb_{split}.jsonl.gz", body)
    config = imdb.ImdbConfig(limit=250, download=False)
    job = imdb.ImdbRun(config, tmp_path / "data", tmp_path / "work", tmp_path / "export",
                       "", 2)
    job.prepare_data()
    assert len(job.train_texts) + len(job.val_texts) == 250
    assert len(job.test_texts) == 200 and len(set(job.test_texts)) == 200
    keep = np.random.default_rng(0).permutation(300)[:250]
    assert sorted(job.train_texts + job.val_texts) == sorted(
        f"train review {i}" for i in keep)


def test_failed_downloads_leave_no_empty_folders(tmp_path, monkeypatch):
    """Offline (here: a file:// URL that does not exist) a download fails
    and leaves no empty multi30k/, ptb/ or tinyshakespeare/ folder; a
    data_dir that is a file is named as such, and Multi30k refuses one
    language on both sides."""
    import pytest

    from keras_trm.data import language_modeling as lm
    from keras_trm.data import load_multi30k, load_ptb, load_tiny_shakespeare

    gone = (tmp_path / "nowhere").as_uri()
    monkeypatch.setattr(lm, "PTB_URL", gone + "/simple-examples.tgz")
    monkeypatch.setattr(lm, "SHAKESPEARE_URL", gone + "/input.txt")
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(OSError, match="nowhere"):
        load_multi30k("val", root, download=True, url=gone + "/")
    with pytest.raises(OSError, match="nowhere"):
        load_ptb("valid", root, download=True)
    with pytest.raises(OSError, match="nowhere"):
        load_tiny_shakespeare("valid", root, download=True)
    assert list(root.iterdir()) == []
    deeper = tmp_path / "new" / "data"
    with pytest.raises(OSError, match="nowhere"):
        load_ptb("valid", deeper, download=True)
    assert not (tmp_path / "new").exists()

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(FileNotFoundError, match="a_file.*not a directory"):
        load_ptb("valid", a_file, download=True)
    with pytest.raises(ValueError, match="`source` and `target` must differ"):
        load_multi30k("val", root, source="en", target="en")
