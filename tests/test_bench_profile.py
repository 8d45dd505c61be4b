"""bench/profile_decoding.py's helpers: the op-type totals read from a real
profiler trace, and greedy's row-steps."""

import pathlib
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from profile_decoding import op_times, row_steps  # noqa: E402


def test_op_times_counts_each_op_of_a_traced_function(tmp_path):
    x = tf.random.normal([64, 64], seed=0)

    @tf.function
    def f(a):
        return tf.linalg.matmul(tf.linalg.matmul(a, a), a) + 1.0

    f(x)  # trace outside the profile
    tf.profiler.experimental.start(str(tmp_path))
    for _ in range(3):
        f(x).numpy()
    tf.profiler.experimental.stop()
    totals = op_times(str(tmp_path))
    matmuls = [op for op in totals if "MatMul" in op]
    assert matmuls, sorted(totals)
    # Two matmuls per call, three calls, each taking time; the addition too.
    assert sum(totals[op][1] for op in matmuls) == 6
    assert all(totals[op][0] > 0 for op in matmuls)
    assert totals["AddV2"][1] == 3
    # The function and executor wrappers are not counted as ops.
    assert not any(op.startswith("__inference") or op.startswith("ExecutorState")
                   for op in totals)


def test_row_steps_count_tokens_up_to_and_with_end():
    end = 3
    ids = np.array([[5, 6, end, 0, 0],     # 3 steps
                    [end, 0, 0, 0, 0],     # 1 step
                    [5, 6, 7, 8, 9],       # no END: ran to the width, 5
                    [5, 6, 7, 0, 0]])      # no END: its own limit, 3
    assert row_steps(ids, end) == (12, 5)
    # The search stops when its longest row ends, before the full width.
    assert row_steps(ids[[0, 1, 3]], end) == (7, 3)
