"""Where a training step's device time goes, by part of the model: a JAX
profile's kernels mapped to the optimized HLO's instructions and, through
the ``op_name`` that Keras' name scopes leave in their metadata
(``jit(train_step)/transpose(jvp(decoder_layer_3))/ffn_norm/...``), to the
model's parts (attention, feed-forward, LayerNorm, dropout, embedding,
logits, loss, optimizer update).

    python bench/step_parts.py TRACE.json.gz HLO_after_optimizations.txt

``bench/gpu_train.py --profile-steps N`` does this under JAX (``by_part``
in its profile): it asks XLA to dump the train step's optimized HLO
(``XLA_FLAGS=--xla_dump_to``) and reads the trace it takes anyway. Needs
only the standard library.

A kernel is tied to its HLO instruction by the ``hlo_op`` argument of its
trace event (the CPU runtime and the GPU tracer record it) or else by its
name: XLA names a fusion's kernel after the instruction, ``.`` written
``_`` (``loop_add_fusion.65`` -> ``loop_add_fusion_65``). A fusion is
counted as a matmul when its computation holds a ``dot`` (or is a cuBLAS
custom call), as fused attention when it calls cuDNN's attention, else as
element-wise or reduction work (``non_matmul``). XLA fuses across layers, so a
fusion is charged to the scope of its root instruction: a residual add
fused into the next LayerNorm counts as LayerNorm.
"""

import collections
import gzip
import json
import re
import sys

# First match wins, on the lower-cased op_name (see ``part_of``).
PARTS = (
    ("optimizer", ("adam", "optimizer", "apply_gradients")),
    ("dropout", ("dropout",)),
    ("loss", ("label_smoothed_ce", "compile_loss", "cross_entropy")),
    ("layer_norm", ("_norm", "layernorm", "layer_norm")),
    ("attention", ("attention",)),
    ("feed_forward", ("ffn", "feed_forward")),
)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
_OPCODE = re.compile(r"\s([a-z][\w\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def part_of(op_name):
    """The model part of an HLO instruction's ``op_name``: one of
    ``PARTS``' names, ``embedding`` (the lookup), ``logits`` (the tied
    output projection: a matmul in the embedding's scope), or ``other``."""
    s = op_name.lower()
    for part, words in PARTS:
        if any(w in s for w in words):
            return part
    if "embedding" in s:
        return "logits" if "dot_general" in s else "embedding"
    return "other"


def direction_of(op_name):
    """``backward`` (under a JAX transpose), ``forward`` (under jvp),
    ``update`` (the optimizer) or ``unscoped``."""
    if part_of(op_name) == "optimizer":
        return "update"
    if "transpose(" in op_name:
        return "backward"
    return "forward" if "jvp(" in op_name else "unscoped"


def read_hlo(text):
    """{instruction name: dict(opcode, op_name, kind)} of an HLO module's
    text; ``kind`` is ``matmul``, ``fused_attention`` or ``non_matmul``."""
    computations = collections.defaultdict(set)  # name -> opcodes and targets within
    rows, current = {}, None
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            c = _COMPUTATION.match(line)
            if c and not line.lstrip().startswith("HloModule"):
                current = c.group(1)
            continue
        name, rest = m.groups()
        opcode = _OPCODE.search(" " + rest)
        opcode = opcode.group(1) if opcode else ""
        target = _TARGET.search(rest)
        target = target.group(1) if target else ""
        op_name = _OP_NAME.search(rest)
        calls = _CALLS.search(rest)
        rows[name] = dict(opcode=opcode, target=target, op_name=op_name.group(1) if op_name else "",
                          calls=calls.group(1) if calls else None)
        computations[current].update({opcode, target} - {""})
    for row in rows.values():
        inside = computations.get(row.pop("calls"), set()) | {row["opcode"], row["target"]}
        text_inside = " ".join(inside).lower()
        if "fmha" in text_inside or "flash" in text_inside or "dot_product_attention" in text_inside:
            row["kind"] = "fused_attention"
        elif inside & {"dot", "convolution"} or "gemm" in text_inside or "matmul" in text_inside:
            row["kind"] = "matmul"
        else:
            row["kind"] = "non_matmul"
        del row["target"]
    return rows


def device_times(events):
    """Device time of a JAX Perfetto trace's complete events: returns
    ({kernel name: µs}, {HLO op, or kernel name where the event names no
    op: µs}, {line name: µs} of the device's other lines, ``where``).
    On a GPU the kernels are the events on the device's CUDA stream lines
    (its derived lines, e.g. "XLA Ops", span the same time); on a CPU the
    host's events that name an ``hlo_op`` (the runtime's thunks; nested,
    so a smoke test only)."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {pid for pid, name in names.items() if "/device:" in name}
    streams = {k for k in threads if k[0] in devices and "stream" in threads[k].lower()}
    kernels, ops, lines = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        key, op = (e["pid"], e.get("tid")), (e.get("args") or {}).get("hlo_op")
        if key in streams or (not streams and e["pid"] in devices) or (not devices and op):
            kernels[e["name"]] += e.get("dur", 0.0)
            ops[op or e["name"]] += e.get("dur", 0.0)
        elif e["pid"] in devices:
            lines[threads.get(key, str(key))] += e.get("dur", 0.0)
    where = "device streams" if streams else "device" if devices else "host thunks (nested)"
    return kernels, ops, lines, where


def by_part(times_us, hlo, steps, top=25):
    """Milliseconds per step by part (and by kind and direction within
    each), the share of the time tied to an HLO instruction, and the
    ``top`` instructions by time with their op_name."""
    sanitized = {name.replace(".", "_").replace("-", "_"): name for name in hlo}
    parts = collections.defaultdict(collections.Counter)
    per_op, unmatched = collections.Counter(), collections.Counter()
    for key, us in times_us.items():
        name = key if key in hlo else sanitized.get(key)
        if name is None:
            unmatched[key] += us
            continue
        row = hlo[name]
        part = part_of(row["op_name"])
        parts[part]["ms_per_step"] += us
        parts[part][row["kind"]] += us
        parts[part][direction_of(row["op_name"])] += us
        per_op[name] += us
    total = sum(times_us.values())

    def ms(us):
        return round(us / 1e3 / steps, 3)
    return dict(
        steps=steps, kernel_ms_per_step=ms(total),
        attributed_fraction=round(1 - sum(unmatched.values()) / total, 4) if total else None,
        parts={p: {k: ms(v) for k, v in sorted(c.items(), key=lambda kv: -kv[1])}
               for p, c in sorted(parts.items(), key=lambda kv: -kv[1]["ms_per_step"])},
        top_ops=[[name, ms(us), hlo[name]["kind"], part_of(hlo[name]["op_name"]),
                  hlo[name]["op_name"][-140:]] for name, us in per_op.most_common(top)],
        top_unattributed=[[k[:100], ms(us)] for k, us in unmatched.most_common(8)])


def main(argv):
    trace, hlo_path = argv
    with gzip.open(trace, "rt") if trace.endswith(".gz") else open(trace) as f:
        events = json.load(f)["traceEvents"]
    with open(hlo_path) as f:
        hlo = read_hlo(f.read())
    print(json.dumps(by_part(device_times(events)[1], hlo, steps=1), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
