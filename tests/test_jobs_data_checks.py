"""The jobs' data checks: copies reused only for the data they came from,
weights exported only with their own prepared folder, damaged data files
named in the error."""

import gzip
import os

from keras_trm.jobs import translation


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


def _prepared_folder(folder, vocabulary):
    """A prepared folder's manifest (no pair files: enough for the checks
    made before any model is built)."""
    from keras_trm.jobs import portable_files as pf
    from keras_trm.utils import write_json

    folder.mkdir(parents=True)
    write_json(folder / pf.MANIFEST, {
        "format": pf.FORMAT, "files": {}, "vocabulary": vocabulary,
        "model": {"vocabulary_size": len(vocabulary), "num_layers": 1}})
    return folder


def test_export_refuses_weights_of_another_prepared_folder(tmp_path):
    """Weights record the SHA-256 of the manifest they were trained on;
    exported with another prepared folder (another vocabulary, the same
    model shape) they are refused, both folders named."""
    import pytest

    from keras_trm.jobs import portable_files as pf
    from keras_trm.jobs.portable_tensorflow import export_portable
    from keras_trm.utils import write_json

    a = _prepared_folder(tmp_path / "a", ["<pad>", "x", "y"])
    b = _prepared_folder(tmp_path / "b", ["<pad>", "p", "q"])
    weights = tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    write_json(weights / pf.WEIGHTS_MANIFEST, {
        "format": pf.WEIGHTS_FORMAT, "model": {"vocabulary_size": 3, "num_layers": 1},
        "prepared_manifest_sha256": pf.sha256_file(a / pf.MANIFEST),
        "weights": [], "files": {}})
    write_json(weights / "result.json", {"prepared": str(a)})
    with pytest.raises(ValueError, match="another prepared folder|trained on") as info:
        export_portable(b, weights, tmp_path / "export")
    message = str(info.value)
    assert str(a) in message and str(b) in message and str(weights) in message
    assert not (tmp_path / "export").exists()


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
