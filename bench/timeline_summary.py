#!/usr/bin/env python3
"""The last whole decode step of a kernel trace (bench/kernel_trace.cpp's CSV), kernel by kernel;
with --prefill, every prefill step's time by kernel family instead.

Kernels are grouped into steps at gaps of more than GAP_US between one kernel's end and the
next one's start (a decode step's graph runs its kernels back to back; the host's work
between steps leaves a gap). The step shown is the second-to-last group with the largest
kernel count that at least three of the last 40 groups have. A kernel's "adds" is the time it extends the step's span
past the end of every kernel before it: the adds of a step sum to its span.
A prefill step (--prefill) is a group of kernels outside CUDA graphs (at gaps of more
than PREFILL_GAP_US) that runs an attention kernel and spans at least PREFILL_MS: the
eager steps of a prompt's chunks, and also any eager decode step that long (the first
step of each decode batch size warms its kernels eagerly); each is printed with its span,
in order, so the prompt's steps are the long ones before the graphs' decode.
  python3 bench/timeline_summary.py [--prefill] TRACE.csv
"""
import collections
import csv
import subprocess
import sys

GAP_US = 4.0
PREFILL_MS = 2.0
PREFILL_GAP_US = 200.0  # an eager step's launches may trail its kernels by a few us

FAMILIES = [  # (family, substrings of the kernel's name), first match wins
    ("attention (prefill)", ["attention_prefill"]),
    ("attention", ["attention"]),
    ("skinny gemm", ["skinny_gemm"]),
    ("gemv", ["gemv", "rows_kernel", "tensor_core"]),
    ("cublasLt", ["sm90_", "nvjet", "cutlass", "xmma", "gemmk", "splitKreduce", "Kernel2"]),
    ("add_rmsnorm", ["add_rmsnorm"]),
    ("rope + K/V write", ["rope"]),
    ("swiglu", ["swiglu"]),
    ("sampling", ["sampl", "softmax", "argmax", "top"]),
    ("embedding", ["embedding", "gather_kernel"]),
    ("l2 prefetch", ["prefetch"]),
]


def family(name):
    for fam, keys in FAMILIES:
        if any(k in name for k in keys):
            return fam
    return "other: " + name[:60]


def demangled(names):
    """name -> its demangled form (c++filt), or itself when c++filt is missing."""
    names = sorted(set(names))
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def print_families(step, span, list_kernels):
    """Each kernel's start, duration and what it adds to the span (list_kernels), then the
    same by family."""
    t0 = step[0][0]
    if list_kernels:
        print(f"{'start us':>9} {'dur us':>7} {'adds us':>7}  kernel")
    fam_dur = collections.defaultdict(float)
    fam_add = collections.defaultdict(float)
    fam_n = collections.Counter()
    reach = t0
    for start, end, name in step:
        adds = max(0, end - max(start, reach)) / 1000
        reach = max(reach, end)
        f = family(name)
        fam_dur[f] += (end - start) / 1000
        fam_add[f] += adds
        fam_n[f] += 1
        if list_kernels:
            print(f"{(start - t0) / 1000:9.1f} {(end - start) / 1000:7.1f} {adds:7.1f}  {name[:110]}")
    print("\nby family")
    print(f"{'family':<22} {'kernels':>7} {'sum dur us':>10} {'adds us':>8} {'of span':>7}")
    for f in sorted(fam_add, key=lambda x: -fam_add[x]):
        print(f"{f:<22} {fam_n[f]:>7} {fam_dur[f]:10.1f} {fam_add[f]:8.1f} {fam_add[f] / span:7.1%}")


def span_us(step):
    return (max(e for _, e, _ in step) - step[0][0]) / 1000


def main():
    prefill = "--prefill" in sys.argv[1:]
    path = [a for a in sys.argv[1:] if a != "--prefill"][0]
    with open(path, newline="") as f:
        # A prefill runs eagerly: only kernels outside graphs (graph node 0).
        rows = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"]) for r in csv.DictReader(f)
                      if not prefill or int(r["graph_node"]) == 0)
    plain = demangled(name for _, _, name in rows)
    rows = [(start, end, plain[name]) for start, end, name in rows]
    steps, cur, last_end = [], [], 0
    for start, end, name in rows:
        if cur and start - last_end > (PREFILL_GAP_US if prefill else GAP_US) * 1000:
            steps.append(cur)
            cur = []
        last_end = max(last_end, end) if cur else end
        cur.append((start, end, name))
    if cur:
        steps.append(cur)
    if prefill:
        chunks = [s for s in steps if span_us(s) >= PREFILL_MS * 1000 and
                  any("attention" in name for _, _, name in s)]
        print(f"{len(steps)} kernel groups; {len(chunks)} prefill steps")
        for i, step in enumerate(chunks):
            print(f"\n== prefill step {i + 1}: {len(step)} kernels, span {span_us(step):.1f} us")
            print_families(step, span_us(step), False)
        return
    tail = steps[-40:]
    # The decode steps repeat: the largest kernel count seen three times or more.
    repeated = [n for n, times in collections.Counter(len(s) for s in tail).items() if times >= 3]
    if not repeated:
        print("no decode step found")
        return
    count = max(repeated)
    step = [s for s in tail if len(s) == count][-2]  # not the very last (the run's end)
    span = span_us(step)
    print(f"{len(steps)} kernel groups; step of {count} kernels, span {span:.1f} us")
    print_families(step, span, True)

if __name__ == "__main__":
    main()
