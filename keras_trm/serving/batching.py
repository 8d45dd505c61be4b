"""Server-side request batching with TF Serving's semantics.

Concurrent requests ("tasks") for the same signature of one model version
are merged into one call: their inputs are concatenated along axis 0 (the
batch axis), the signature runs once, and its outputs are split back by
each task's row count, as in TF Serving's ``BasicBatchScheduler``
(``BatchingOptions`` gives the settings). Only tasks whose inputs have the
same dtypes and the same shapes after axis 0 share a batch (a task that
does not fit the open batch closes it and opens the next). Which signatures
may be batched is the caller's decision (``ServableVersion`` batches those
whose every input and output has an unknown batch dimension 0).
"""

import collections
import concurrent.futures
import dataclasses
import os
import threading
import time

import numpy as np

from keras_trm.serving.errors import InvalidArgument, ServingError, Unavailable

# Bounds past which a setting is a mistake: a wait over a day overflowed the
# batch threads' clock (their requests hung); each thread is started.
MAX_BATCH_TIMEOUT_MICROS = 86_400 * 10**6
MAX_BATCH_THREADS = 1024


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """TF Serving's ``BatchingParameters`` (the ones this server honours).

    Args:
        max_batch_size: int >= 1, rows per batch at most; a task is never
            split: a larger one is refused (``INVALID_ARGUMENT``).
        batch_timeout_micros: int in [0, 86,400,000,000] (a day), the
            longest a batch waits for more tasks after its first one (it
            also closes when full). With 0 a batch runs as soon as a batch
            thread is free, so batches grow exactly while all are busy.
        num_batch_threads: int in [1, 1024], batches of one model version
            run at once (default: the number of CPU cores).
        max_enqueued_batches: int >= 1, batches waiting per signature (the
            open one included); a task needing one more is refused with
            ``UNAVAILABLE`` ("the batch scheduling queue ... is full").
        allowed_batch_sizes: increasing ints ending in ``max_batch_size``:
            a batch is padded (repeating its first row; the padding's
            outputs are dropped) up to the next one; or ``()``.

    Raises:
        ValueError: a value out of range, naming the field and the value.
    """

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    num_batch_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    max_enqueued_batches: int = 100
    allowed_batch_sizes: tuple = ()

    def __post_init__(self):
        for name, low, high in (("max_batch_size", 1, None),
                                ("batch_timeout_micros", 0, MAX_BATCH_TIMEOUT_MICROS),
                                ("num_batch_threads", 1, MAX_BATCH_THREADS),
                                ("max_enqueued_batches", 1, None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                    high is not None and value > high):
                within = f">= {low}" if high is None else f"in [{low}, {high}]"
                raise ValueError(f"`{name}` must be an int {within}, got {name}={value!r}")
        sizes = tuple(int(s) for s in self.allowed_batch_sizes)
        object.__setattr__(self, "allowed_batch_sizes", sizes)
        if sizes and (list(sizes) != sorted(set(sizes)) or sizes[0] < 1
                      or sizes[-1] != self.max_batch_size):
            raise ValueError("`allowed_batch_sizes` must be increasing positive sizes whose "
                             f"last equals max_batch_size={self.max_batch_size}, got "
                             f"allowed_batch_sizes={list(sizes)}")


@dataclasses.dataclass(eq=False)
class _Task:
    inputs: dict
    size: int
    key: tuple  # what tasks must share to be concatenated: dtypes, shapes after axis 0
    future: concurrent.futures.Future = dataclasses.field(
        default_factory=concurrent.futures.Future)


@dataclasses.dataclass(eq=False)
class _Batch:
    signature: str
    key: tuple
    deadline: float
    tasks: list = dataclasses.field(default_factory=list)
    size: int = 0
    closed: bool = False


class BatchScheduler:
    """Merges concurrent tasks of one model version into batched calls of
    ``run(signature_name, inputs) -> outputs`` (dicts of numpy arrays whose
    axis 0 is the batch axis) as ``options`` (``BatchingOptions``) say;
    ``name`` is for thread names and messages."""

    def __init__(self, run, options, name="model"):
        self._run = run
        self.options = options
        self.name = name
        self._queues = {}
        self._cond = threading.Condition()
        self._stopping = False
        self.stats = collections.Counter()  # batches, tasks, rows run
        self._threads = [
            threading.Thread(target=self._loop, name=f"batch-{name}-{i}", daemon=True)
            for i in range(options.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def schedule(self, signature, inputs):
        """Runs ``inputs`` (dict of arrays, equal axis-0 sizes) in a batch;
        blocks until it ran and returns the task's rows of the outputs.

        Raises:
            InvalidArgument: the task has more rows than ``max_batch_size``.
            Unavailable: the signature's queue is full, or the scheduler
                is stopping.
            ServingError (or what ``run`` raised): the batch failed.
        """
        sizes = {int(v.shape[0]) for v in inputs.values()}
        if len(sizes) != 1:
            raise InvalidArgument("inputs of one request must share their batch size (axis 0), "
                                  f"got { {k: int(v.shape[0]) for k, v in inputs.items()} }")
        (size,) = sizes
        options = self.options
        if size > options.max_batch_size:
            raise InvalidArgument(
                f"Task size {size} is larger than maximum input batch size "
                f"{options.max_batch_size} (max_batch_size of model {self.name!r})")
        task = _Task(inputs, size, tuple(sorted(
            (name, value.dtype.str, value.shape[1:]) for name, value in inputs.items())))
        with self._cond:
            if self._stopping:
                raise Unavailable(f"model {self.name!r} is unloading; retry")
            queue = self._queues.setdefault(signature, collections.deque())
            batch = queue[-1] if queue else None
            if (batch is None or batch.closed or batch.key != task.key
                    or batch.size + size > options.max_batch_size):
                if batch is not None:
                    batch.closed = True
                if len(queue) >= options.max_enqueued_batches:
                    raise Unavailable(
                        "The batch scheduling queue to which this task was submitted "
                        f"is full (model {self.name!r}, signature {signature!r}, "
                        f"max_enqueued_batches={options.max_enqueued_batches})")
                deadline = time.monotonic() + options.batch_timeout_micros / 1e6
                batch = _Batch(signature, task.key, deadline)
                queue.append(batch)
            batch.tasks.append(task)
            batch.size += size
            if batch.size == options.max_batch_size:
                batch.closed = True
            self._cond.notify()
        return task.future.result()

    def queued_tasks(self, signature=None):
        """How many tasks wait in batches not running yet (of ``signature``,
        or all)."""
        with self._cond:
            queues = (self._queues.values() if signature is None
                      else [self._queues.get(signature, ())])
            return sum(len(batch.tasks) for queue in queues for batch in queue)

    def _next_batch(self):
        """The oldest ready batch, waiting for one; None once stopped and empty."""
        with self._cond:
            while True:
                now = time.monotonic()
                heads = [queue[0] for queue in self._queues.values() if queue]
                ready = [b for b in heads if b.closed or b.deadline <= now or self._stopping]
                if ready:
                    batch = min(ready, key=lambda b: b.deadline)
                    self._queues[batch.signature].popleft()
                    batch.closed = True
                    return batch
                if self._stopping:
                    return None
                wake = min((b.deadline for b in heads), default=None)
                self._cond.wait(None if wake is None else max(wake - now, 0.0))

    def _loop(self):
        while (batch := self._next_batch()) is not None:
            self._process(batch)

    def _process(self, batch):
        tasks = batch.tasks
        with self._cond:
            self.stats.update(batches=1, tasks=len(tasks), rows=batch.size)
        try:
            outputs = self._run_merged(batch.signature, tasks, batch.size)
        except Exception as err:  # noqa: BLE001 - handed to the waiting requests
            # One task's content broke a batch of several: each runs alone,
            # so that only the faulty request fails.
            alone = len(tasks) > 1 and isinstance(err, InvalidArgument)
            for task in tasks:
                if not alone:
                    task.future.set_exception(err)
                    continue
                try:
                    task.future.set_result(self._run_merged(batch.signature, [task], task.size))
                except Exception as task_err:  # noqa: BLE001
                    task.future.set_exception(task_err)
            return
        start = 0
        for task in tasks:
            stop = start + task.size
            task.future.set_result({k: v[start:stop] for k, v in outputs.items()})
            start = stop

    def _run_merged(self, signature, tasks, size):
        inputs = tasks[0].inputs if len(tasks) == 1 else {
            k: np.concatenate([t.inputs[k] for t in tasks]) for k in tasks[0].inputs}
        padded = next((a for a in self.options.allowed_batch_sizes if a >= size), size)
        if padded > size:
            inputs = {k: np.concatenate([v, np.repeat(v[:1], padded - size, axis=0)])
                      for k, v in inputs.items()}
        outputs = self._run(signature, inputs)
        for name, value in outputs.items():
            if np.ndim(value) == 0 or value.shape[0] != padded:
                raise ServingError(f"batched output {name!r} has shape {list(np.shape(value))} "
                                   f"for a batch of {padded} rows: signature {signature!r} of "
                                   f"model {self.name!r} cannot be batched along axis 0")
        if padded > size:
            outputs = {k: v[:size] for k, v in outputs.items()}
        return outputs

    def stop(self, timeout=30.0):
        """Runs what is queued, then ends the batch threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
