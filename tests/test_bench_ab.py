"""bench/ab.py and bench/common.py: a revision's code as a tree that a child
process imports, turns taken A B, B A, ..., and a real (tiny) A/B of the
loss between two trees of the same code."""

import json
import shutil
import subprocess
import sys

import pytest

from bench import ab, common

ROOT = common.ROOT


def test_tree_at_exports_a_commit_once_and_takes_folders_as_they_are(tmp_path):
    folder, commit = common.tree_at("HEAD", cache=tmp_path)
    assert commit == common.git("rev-parse", "HEAD") and folder == tmp_path / commit
    committed = subprocess.run(["git", "show", f"{commit}:keras_trm/__init__.py"], cwd=ROOT,
                               check=True, capture_output=True).stdout
    assert (folder / "keras_trm" / "__init__.py").read_bytes() == committed
    (folder / "marker").write_text("kept")  # a second call reuses the export
    assert common.tree_at(commit[:10], cache=tmp_path) == (folder, commit)
    assert (folder / "marker").read_text() == "kept"
    assert common.tree_at(str(ROOT)) == (ROOT, None)
    with pytest.raises(ValueError, match="revision.*no-such-revision"):
        common.tree_at("no-such-revision", cache=tmp_path)


def test_alternate_takes_turns():
    order = []
    runs = ab.alternate(3, lambda name: order.append(name) or len(order))
    assert "".join(order) == "abbaab"
    assert runs == {"a": [1, 4, 5], "b": [2, 3, 6]}


def test_loss_ab_imports_each_tree_and_repeats_its_figures(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "keras_trm", tree / "keras_trm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ab.py"), "train_step", "--a", str(tree),
         "--b", ".", "--part", "loss", "--runs", "1", "--steps", "2", "--warmup", "1",
         "--batch", "2", "--length", "4", "--vocabulary", "50", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (a,), (b,) = result["runs"]["a"], result["runs"]["b"]
    assert a["keras_trm"] == str(tree / "keras_trm" / "__init__.py")
    assert b["keras_trm"] == str(ROOT / "keras_trm" / "__init__.py")
    # The same code on the same seeded logits: the same loss and gradient.
    assert result["same_loss"] and result["same_gradient_abs_sum"]
    assert a["loss"] > 0 and a["grad_abs_sum"] > 0 and a["peak_tensor_mib"] >= 0
    assert result["speed_b_over_a"] == pytest.approx(
        b["tokens_per_second"] / a["tokens_per_second"])
    assert result["host"]["cpu_count"] >= 1 and result["a"]["commit"] is None
