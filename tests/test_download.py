"""The download path of the loaders, for real but offline: the official
Multi30k files (copied from the shared data) served by a loopback HTTP
server, a corrupt file, and a server that drops the connection. The
server listens on 127.0.0.1 only and is shut down by the fixture."""

import functools
import http.server
import os
import pathlib
import shutil
import threading

import pytest

from keras_trm.data import load_multi30k
from keras_trm.data import translation
from keras_trm.data.download import fetch
from keras_trm.data.translation import MULTI30K_SHA256, load_translation_splits


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; under /drop/ it announces the whole file but
    sends half of it and closes the connection."""

    def do_GET(self):
        if not self.path.startswith("/drop/"):
            return super().do_GET()
        data = (pathlib.Path(self.directory) / self.path[len("/drop/"):]).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def server(tmp_path, data_dir):
    """``(base_url, served_folder)``: the six official Multi30k files."""
    served = tmp_path / "served"
    shutil.copytree(data_dir / "multi30k", served)
    handler = functools.partial(_Handler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", served
    httpd.shutdown()
    httpd.server_close()
    thread.join(30)


def _listing(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_checksums_are_those_of_the_shared_copies(data_dir):
    import hashlib

    for name, digest in MULTI30K_SHA256.items():
        data = (data_dir / "multi30k" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name


def test_multi30k_downloads_what_the_local_files_hold(server, tmp_path, data_dir):
    url, _ = server
    cache = tmp_path / "cache"
    got = load_multi30k("val", cache, download=True, url=url)
    assert got == load_multi30k("val", data_dir)
    assert len(got[0]) == 1014
    # Only the split's two files, complete: no temporary file left.
    assert _listing(cache / "multi30k") == ["val.de.gz", "val.en.gz"]
    # Present now: read again without any server.
    assert load_multi30k("val", cache, download=False) == got


def test_the_url_comes_from_the_environment(server, tmp_path, data_dir,
                                            monkeypatch):
    url, _ = server
    monkeypatch.setenv(translation.MULTI30K_URL_ENV, url.rstrip("/"))
    cache = tmp_path / "cache"
    splits = load_translation_splits("multi30k", cache, "de", "en",
                                     download=True)
    assert splits.test == load_multi30k("test_2016_flickr", data_dir,
                                        source="de", target="en")
    assert len(splits.train[0]) == 29000
    assert _listing(cache / "multi30k") == sorted(MULTI30K_SHA256)


def test_a_corrupt_file_is_refused_and_not_kept(server, tmp_path):
    url, served = server
    path = served / "val.en.gz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    path.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="val.en.gz has SHA-256 .* expected "
                       + MULTI30K_SHA256["val.en.gz"]):
        load_multi30k("val", cache, download=True, url=url)
    assert "val.en.gz" not in _listing(cache / "multi30k")
    assert not [n for n in _listing(cache / "multi30k") if n.endswith(".part")]


def test_a_dropped_connection_is_an_error_and_not_kept(server, tmp_path):
    url, _ = server
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match=r"drop/val\.en\.gz failed: the connection"):
        load_multi30k("val", cache, download=True, url=url + "drop/")
    assert _listing(cache / "multi30k") == []


def test_fetch_replaces_a_file_only_with_a_verified_one(server, tmp_path):
    url, served = server
    target = tmp_path / "val.de.gz"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="SHA-256"):
        fetch(url + "val.de.gz", target, sha256="0" * 64)
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["served", "val.de.gz"]  # no partial file
    fetch(url + "val.de.gz", target, sha256=MULTI30K_SHA256["val.de.gz"])
    assert target.read_bytes() == (served / "val.de.gz").read_bytes()
    with pytest.raises(OSError, match="127.0.0.1"):
        fetch(url + "missing.gz", tmp_path / "missing.gz")
    assert not (tmp_path / "missing.gz").exists()


def test_without_download_the_error_names_the_flag_that_exists(tmp_path):
    from keras_trm.cli import config_parser, parse_config
    from keras_trm.jobs.translation import TranslationConfig

    with pytest.raises(FileNotFoundError, match="--download true"):
        load_multi30k("val", tmp_path)
    parser = config_parser("t", "T.", TranslationConfig, "runs/t")
    assert parse_config(parser, TranslationConfig, [])[0].download
    config, _ = parse_config(parser, TranslationConfig, ["--download", "false"])
    assert config.download is False


def test_jobs_resolve_the_download_cache_when_no_data_folder_exists(
        tmp_path, monkeypatch):
    from keras_trm.data import paths
    from keras_trm.jobs._setup import start_job

    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    cache = tmp_path / "home" / "keras_trm_data"
    monkeypatch.setattr(paths, "default_candidates",
                        lambda: (tmp_path / "nowhere", cache))
    with pytest.raises(FileNotFoundError, match="No data directory"):
        start_job(tmp_path / "work", verbose=2)
    assert start_job(tmp_path / "work", verbose=2, download=True).data_dir == cache
    assert os.path.isdir(tmp_path / "work")
