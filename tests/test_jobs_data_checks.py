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
