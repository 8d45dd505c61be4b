"""bench/seeds.py: several seeds' result.json files summarized in one
JSON (run as the README's command does, in a subprocess)."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.portable


def test_seeds_summary(tmp_path):
    paths = []
    for seed, perplexity in ((2, 80.0), (0, 77.0), (1, 78.5)):
        path = tmp_path / f"s{seed}" / "result.json"
        path.parent.mkdir()
        result = {"config": {"seed": seed}, "steps": 8000 + seed,
                  "transformer_xl": {"test": {"perplexity": perplexity}},
                  "vanilla": None if seed else {"test": {"perplexity": 90.0}}}
        path.write_text(json.dumps(result))
        paths.append(str(path))
    out = tmp_path / "seeds.json"
    proc = subprocess.run(
        [sys.executable, "bench/seeds.py", *paths, "--out", str(out),
         "--key", "transformer_xl.test.perplexity", "--key", "steps",
         "--key", "vanilla.test.perplexity"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert [run["seed"] for run in summary["runs"]] == [0, 1, 2]
    ppl = summary["transformer_xl"]["test"]["perplexity"]
    assert ppl == {"runs": 3, "mean": 78.5, "sample_std": 1.5, "min": 77.0,
                   "max": 80.0}
    assert summary["steps"]["mean"] == 8001
    # Only seed 0 has a vanilla figure: one run, no spread.
    assert summary["vanilla"]["test"]["perplexity"] == {
        "runs": 1, "mean": 90.0, "sample_std": None, "min": 90.0, "max": 90.0}
