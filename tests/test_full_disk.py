"""A full disk loses nothing and never crashes the process (#38).

Before: ``model.save_weights`` (HDF5 writing the file itself) on a full
file system raised ``OSError`` errno 28 from h5py, left the HDF5 file open,
and the process died with a segmentation fault when it exited; the export
raised TensorFlow's ``ResourceExhaustedError`` before ``result.json`` was
written; errors did not say which file or how much space.

The unit tests fake ENOSPC (``os.fsync`` of the chosen file raises it);
``test_real_full_tmpfs_*`` runs a child process on a real, small tmpfs
mounted in a user namespace (``unshare -rm``) and is skipped, with the
reason, where that is not allowed.
"""

import errno
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_trm.export.saved_model import export_module
from keras_trm.training import TrainingBackup
from keras_trm.training.checkpoints import save_weights_atomic
from keras_trm.utils import atomic_write, files


def _fail_fsync_for(monkeypatch, matches):
    """``os.fsync`` raises ENOSPC for files whose name ``matches(name)``."""
    real = os.fsync

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if matches(pathlib.Path(name).name):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _state(model):
    return [v.numpy().copy() for v in model.weights + model.optimizer.variables]


def _check_message(error, path, needed=None):
    assert error.errno == errno.ENOSPC
    text = str(error)
    assert f"no space left on device writing {path}: " in text, text
    # ~N: the file's size or the previous one's; "more than N": what was
    # written before the failure (a first export).
    assert re.search(r": needed (~|more than )[\d.]+ [kMG]?B, [\d.]+ [kMG]?B free$",
                     text), text
    if needed is not None:
        assert f"needed ~{files.format_bytes(needed)}," in text, text


def test_atomic_write_keeps_the_old_file_and_names_path_and_sizes(
        tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    path.write_text("old")
    _fail_fsync_for(monkeypatch, lambda name: name.startswith(".result.json."))
    data = "x" * 5000
    with pytest.raises(OSError) as info:
        atomic_write(path, data)
    _check_message(info.value, path, needed=5000)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_save_weights_atomic_on_full_disk_keeps_the_previous_file(
        tmp_path, monkeypatch):
    model = _model()
    path = tmp_path / "step_1.weights.h5"
    save_weights_atomic(model, path)
    old = _state(model)
    model.set_weights([w + 1 for w in model.get_weights()])
    _fail_fsync_for(monkeypatch, lambda name: name.endswith(".tmp"))
    with pytest.raises(OSError) as info:
        save_weights_atomic(model, path)
    _check_message(info.value, path, needed=path.stat().st_size)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    fresh = _model()
    fresh.load_weights(path)
    assert all(np.array_equal(a, b) for a, b in zip(old, _state(fresh)))


class _DiskFillsAfterFirstBackup(keras.callbacks.Callback):
    """From epoch 2 on (after the epoch-1 backup is written) the chosen
    files fail with ENOSPC; keeps the state that backup holds."""

    def __init__(self, monkeypatch, matches):
        super().__init__()
        self.monkeypatch, self.matches, self.saved = monkeypatch, matches, None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            self.saved = _state(self.model)
            _fail_fsync_for(self.monkeypatch, self.matches)


@pytest.mark.parametrize("fails", ["weights", "state.json"])
def test_backup_on_full_disk_keeps_the_previous_backup_and_resumes(
        tmp_path, monkeypatch, fails):
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    backup_dir = tmp_path / "backup"
    model = _model()
    disk = _DiskFillsAfterFirstBackup(
        monkeypatch, (lambda n: n.startswith(".step_")) if fails == "weights"
        else (lambda n: n.startswith(".state.json.")))
    backup = TrainingBackup(backup_dir, steps_per_epoch=4)
    with pytest.raises(OSError) as info:
        model.fit(x, y, batch_size=4, epochs=3, verbose=0,
                  callbacks=[backup, disk])
    name = "step_000000008.weights.h5" if fails == "weights" else "state.json"
    _check_message(info.value, backup_dir / name)
    # The epoch-1 backup is complete and alone: no temporary, no orphan.
    state = json.loads((backup_dir / "state.json").read_text())
    assert state["epoch"] == 1
    assert sorted(p.name for p in backup_dir.iterdir()) == [
        "state.json", state["weights"]]
    fresh = _model()
    fresh.load_weights(backup_dir / state["weights"])
    assert all(np.array_equal(a, b) for a, b in zip(disk.saved, _state(fresh)))
    # Space again: the same training resumes from that backup.
    monkeypatch.undo()
    resumed = TrainingBackup(backup_dir, steps_per_epoch=4)
    history = _model().fit(x, y, batch_size=4, epochs=3, verbose=0,
                           callbacks=[resumed])
    assert resumed.restored["epoch"] == 1
    assert len(history.history["loss"]) == 2  # epochs 2 and 3 only
    assert json.loads((backup_dir / "state.json").read_text())["epoch"] == 3


class _Double(tf.Module):
    def __init__(self):
        super().__init__()
        self.v = tf.Variable(np.ones((64, 64), np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(self, x):
        return {"y": tf.reduce_sum(self.v) * x}


def test_export_on_full_disk_names_the_version_and_leaves_nothing(
        tmp_path, monkeypatch):
    module = _Double()
    first = export_module(module, tmp_path, "m",
                          signatures={"serving_default": module.serve})
    real_save = tf.saved_model.save

    def full_disk_save(obj, export_dir, **kwargs):
        real_save(obj, export_dir, **kwargs)  # then the disk is full:
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{export_dir}/variables/variables_temp/part-00000; "
            "No space left on device [Op:SaveV2]")

    monkeypatch.setattr(tf.saved_model, "save", full_disk_save)
    with pytest.raises(OSError) as info:
        export_module(module, tmp_path, "m",
                      signatures={"serving_default": module.serve})
    _check_message(info.value, tmp_path / "m" / "2",
                   needed=files.tree_bytes(first))
    assert isinstance(info.value.__cause__, tf.errors.ResourceExhaustedError)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["1"]
    serve = tf.saved_model.load(str(first)).signatures["serving_default"]
    assert serve(tf.constant([1.0]))["y"].numpy().tolist() == [4096.0]


@pytest.mark.slow
def test_translation_job_writes_result_json_when_the_export_fails(
        data_dir, tmp_path, monkeypatch):
    """The export dir is full: result.json is written (``"export": null``
    and the message), then the error is raised; the same command run
    again with space trains no further and exports."""
    import gzip

    from keras_trm.data import read_lines
    from keras_trm.jobs import translation

    corpus = {}
    for lang in ("en", "de"):
        lines = read_lines(data_dir / "multi30k" / f"train.{lang}.gz")[:240]
        for split, part in (("train", lines[:200]), ("val", lines[200:220]),
                            ("test", lines[220:])):
            path = tmp_path / f"{split}.{lang}.gz"
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write("\n".join(part) + "\n")
            corpus[split, lang] = str(path)
    config = translation.TranslationConfig(
        dataset="files", train_source=corpus["train", "en"],
        train_target=corpus["train", "de"],
        validation_source=corpus["val", "en"], validation_target=corpus["val", "de"],
        test_source=corpus["test", "en"], test_target=corpus["test", "de"],
        preset="tiny", epochs=1, average_last=1, model_name="tiny")
    work, export = tmp_path / "work", tmp_path / "export"

    def full_disk_save(obj, export_dir, **kwargs):
        (pathlib.Path(export_dir) / "saved_model.pb").write_bytes(b"partial")
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{export_dir}/saved_model.pb; No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(tf.saved_model, "save", full_disk_save)
        with pytest.raises(OSError) as info:
            translation.run(config, data_dir, work, export)
    _check_message(info.value, export / "tiny" / "1")
    result = json.loads((work / "result.json").read_text())
    assert result["export"] is None
    assert str(export / "tiny" / "1") in result["export_error"]
    assert result["test_bleu"] is not None and result["epochs"] == 1
    assert list((export / "tiny").iterdir()) == []
    again = translation.run(config, data_dir, work, export)
    assert again["export"] == str(export / "tiny" / "1")
    assert again["export_error"] is None
    # Resumed from the finished backup: the same epoch, not trained again.
    assert again["epochs_log"] == result["epochs_log"] and again["epochs"] == 1
    assert again["test_bleu"] == result["test_bleu"]
    assert (export / "tiny" / "1" / "saved_model.pb").is_file()


# -- a real full file system --------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, pathlib, sys
    import keras, numpy as np, tensorflow as tf
    from keras_trm.export.saved_model import export_module
    from keras_trm.training import TrainingBackup

    mnt = pathlib.Path(sys.argv[1]); backup_dir = mnt / "backup"
    report = {}

    def model():
        m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024),
                              keras.layers.Dense(1)])
        m.compile("adam", "mse"); m.optimizer.build(m.trainable_variables)
        return m

    def state(m):
        return [v.numpy().copy() for v in m.weights + m.optimizer.variables]

    class FillDisk(keras.callbacks.Callback):
        saved = None
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:  # the epoch-1 backup is written: fill the disk
                FillDisk.saved = state(self.model)
                free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
                with open(mnt / "ballast", "wb") as f:
                    f.write(b"\\0" * (free - 200_000))

    x = np.random.default_rng(0).normal(size=(32, 64)).astype("float32")
    y = x[:, :1]
    try:
        model().fit(x, y, batch_size=8, epochs=3, verbose=0,
                    callbacks=[TrainingBackup(backup_dir, steps_per_epoch=4),
                               FillDisk()])
        report["fit"] = "no error"
    except OSError as error:
        report["fit"] = [error.errno, str(error)]
    report["backup_files"] = sorted(p.name for p in backup_dir.iterdir())
    st = json.loads((backup_dir / "state.json").read_text())
    fresh = model(); fresh.load_weights(backup_dir / st["weights"])
    report["backup_epoch"] = st["epoch"]
    report["backup_equal"] = all(
        np.array_equal(a, b) for a, b in zip(FillDisk.saved, state(fresh)))

    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.v = tf.Variable(np.ones((512, 512), np.float32))
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": tf.reduce_sum(self.v) * x}
    module = M()
    try:
        export_module(module, mnt / "export", "m",
                      signatures={"serving_default": module.serve})
        report["export"] = "no error"
    except Exception as error:  # the old code: ResourceExhaustedError
        report["export"] = [getattr(error, "errno", None), str(error)]
    report["export_files"] = sorted(
        str(p.relative_to(mnt)) for p in (mnt / "export").rglob("*"))

    (mnt / "ballast").unlink()  # space again: the same training resumes
    resumed = TrainingBackup(backup_dir, steps_per_epoch=4)
    history = model().fit(x, y, batch_size=8, epochs=3, verbose=0,
                          callbacks=[resumed])
    report["resumed_from"] = resumed.restored["epoch"]
    report["resumed_epochs"] = len(history.history["loss"])
    report["final_epoch"] = json.loads(
        (backup_dir / "state.json").read_text())["epoch"]
    print("REPORT " + json.dumps(report), flush=True)
""")


def _tmpfs_in_user_namespace(mountpoint):
    """None if ``unshare -rm`` can mount a tmpfs here, else why not."""
    if shutil.which("unshare") is None:
        return "`unshare` is not installed"
    try:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c",
             'mount -t tmpfs -o size=1m none "$0"', str(mountpoint)],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare -rm` failed: {error}"
    if probe.returncode:
        return ("no tmpfs in a user namespace (`unshare -rm ... mount -t tmpfs`"
                f" exits {probe.returncode}: {probe.stderr.strip()})")
    return None


def test_real_full_tmpfs_no_crash_previous_backup_kept_and_resume(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    why = _tmpfs_in_user_namespace(mnt)
    if why:
        pytest.skip(why)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    child = subprocess.run(
        ["unshare", "-rm", "sh", "-c",
         'mount -t tmpfs -o size=4m none "$0" && exec "$1" "$2" "$0"',
         str(mnt), sys.executable, str(script)],
        capture_output=True, text=True, timeout=240, env=env)
    out = child.stdout + child.stderr
    # The old code: "Segmentation fault" as the process exits (rc -11/139).
    assert child.returncode == 0, out[-3000:]
    report = json.loads(out.split("REPORT ", 1)[1].splitlines()[0])
    code, message = report["fit"]
    assert code == errno.ENOSPC
    match = re.fullmatch(
        rf"\[Errno 28\] no space left on device writing {mnt}/backup/"
        r"step_000000008\.weights\.h5: needed ~([\d.]+) kB, ([\d.]+) kB free",
        message)
    assert match and float(match[1]) > 800 > 200 > float(match[2]), message
    assert report["backup_files"] == ["state.json", "step_000000004.weights.h5"]
    assert report["backup_epoch"] == 1 and report["backup_equal"]
    code, message = report["export"]
    assert code == errno.ENOSPC
    assert message.startswith(
        f"[Errno 28] no space left on device writing {mnt}/export/m/1: "), message
    assert report["export_files"] == ["export/m"]
    assert report["resumed_from"] == 1 and report["resumed_epochs"] == 2
    assert report["final_epoch"] == 3


def test_cli_reports_a_full_disk_in_one_line_without_traceback(
        tmp_path, monkeypatch, capsys):
    """``keras-trm train-translation`` on a full disk: exit 1 and one
    message naming the path and the space needed, no traceback; any other
    error still raises (a bug keeps its traceback)."""
    from keras_trm import cli
    from keras_trm.jobs import translation

    path = tmp_path / "work" / "backup" / "step_000000008.weights.h5"

    def full(*args, **kwargs):
        raise files.no_space_error(path, needed=3_100_000)

    monkeypatch.setattr(translation, "run", full)
    argv = ["train-translation", "--workdir", str(tmp_path / "work"),
            "--export_dir", str(tmp_path / "export")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith("keras-trm train-translation: error: [Errno 28] "
                            f"no space left on device writing {path}: "
                            "needed ~3.1 MB, "), first
    assert "run the same command again" in err

    def bug(*args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(translation, "run", bug)
    with pytest.raises(PermissionError):
        cli.main(argv)


def test_files_written_through_temporaries_get_the_usual_permissions(tmp_path):
    """mkstemp/mkdtemp make 0600 files and 0700 folders: a result file or a
    SavedModel version written through them could not be read by another
    user (a server running as its own user). They now get 0666 / 0777
    less the umask, as open() and mkdir() give."""
    import os
    import stat

    from keras_trm.utils.files import atomic_directory, atomic_write

    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "result.json", "{}")
        with atomic_directory(tmp_path / "export" / "1") as folder:
            (folder / "saved_model.pb").write_bytes(b"")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "export" / "1").stat().st_mode) == 0o755
