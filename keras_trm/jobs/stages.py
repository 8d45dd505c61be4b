"""The skeleton the jobs share: a job is a list of named stages run in
order over one object that carries what each stage made for the next.

    prepare data -> build -> fit -> select/average -> evaluate -> export -> report

A job subclasses ``StagedJob``, lists its stage methods in ``STAGES`` and
sets ``self.result`` in its last stage. ``run()`` times every stage
(``stage_seconds``, also in the result) and stops early where a stage
returns a result (e.g. a non-chief worker after ``fit``). Each stage is a
short method that reads the attributes earlier stages set; none reaches
into another's locals, so a stage can be read, tested or replaced alone.
"""

import time


class StagedJob:
    """Runs the methods named in ``STAGES`` in order.

    Subclasses set ``STAGES`` (a tuple of method names) and, in their last
    stage, ``self.result`` (a dict). A stage that returns a dict ends the
    job with that dict as its result.

    Example:
        >>> class Double(StagedJob):
        ...     STAGES = ("prepare", "report")
        ...     def __init__(self, x):
        ...         self.x = x
        ...     def prepare(self):
        ...         self.y = 2 * self.x
        ...     def report(self):
        ...         self.result = {"y": self.y}
        >>> job = Double(21)
        >>> job.run()["y"], list(job.stage_seconds)
        (42, ['prepare', 'report'])
    """

    STAGES = ()

    def run(self):
        """Runs the stages; returns the result dict (with
        ``stage_seconds``: wall seconds per stage run)."""
        self.stage_seconds = {}
        self.result = None
        for name in self.STAGES:
            started = time.time()
            early = getattr(self, name)()
            self.stage_seconds[name] = round(time.time() - started, 1)
            if early is not None:
                self.result = early
                break
        if self.result is None:
            raise RuntimeError(f"{type(self).__name__}: no stage set `result` "
                               f"(stages {self.STAGES})")
        # A stage that writes the result (the last) records the stages
        # before it itself; otherwise every stage run is recorded here.
        self.result.setdefault("stage_seconds", self.stage_seconds)
        return self.result
