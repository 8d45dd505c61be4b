"""keras_trm.jobs.stages: the skeleton the jobs share runs its stages in
order, times each, and stops where a stage returns a result."""

import pytest

from keras_trm.jobs.stages import StagedJob

pytestmark = pytest.mark.portable  # CI runs it under each backend


class Recorder(StagedJob):
    STAGES = ("prepare_data", "fit", "report")

    def __init__(self, stop_after_fit=False):
        self.ran, self.stop_after_fit = [], stop_after_fit

    def prepare_data(self):
        self.ran.append("prepare_data")
        self.data = [1, 2, 3]

    def fit(self):
        self.ran.append("fit")
        self.total = sum(self.data)  # reads what the earlier stage set
        if self.stop_after_fit:
            return {"worker": 1, "total": self.total}

    def report(self):
        self.ran.append("report")
        self.result = {"total": self.total}


def test_stages_run_in_order_and_are_timed():
    job = Recorder()
    result = job.run()
    assert job.ran == ["prepare_data", "fit", "report"]
    assert result["total"] == 6
    assert list(result["stage_seconds"]) == ["prepare_data", "fit", "report"]
    assert all(s >= 0 for s in result["stage_seconds"].values())


def test_a_stage_that_returns_a_result_ends_the_job():
    job = Recorder(stop_after_fit=True)
    result = job.run()
    assert job.ran == ["prepare_data", "fit"]
    assert result == {"worker": 1, "total": 6,
                      "stage_seconds": job.stage_seconds}
    assert list(job.stage_seconds) == ["prepare_data", "fit"]


def test_a_job_whose_stages_set_no_result_fails_loudly():
    class Forgetful(StagedJob):
        STAGES = ("prepare_data",)

        def prepare_data(self):
            pass

    with pytest.raises(RuntimeError, match="no stage set `result`"):
        Forgetful().run()
