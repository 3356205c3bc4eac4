#!/usr/bin/env python3
"""Groups an `ncu --csv --page raw` profile of `cellm bench` by kernel.

Usage: ncu_summary.py PROFILE.csv STEP_KERNELS [STEPS]
The last STEPS (default 3) decode steps are the last STEPS * STEP_KERNELS
kernel rows; prints, per kernel name, launches per step and microseconds per
step, largest first, and the step's total.
"""
import collections
import csv
import sys


def main() -> None:
    path, per_step = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    rows = [r for r in rows if r.get("gpu__time_duration.sum", "").replace(".", "").isdigit()]
    tail = rows[-per_step * steps:]
    time = collections.defaultdict(float)
    count = collections.Counter()
    for r in tail:
        name = r["Kernel Name"].split("(")[0][:70]
        time[name] += float(r["gpu__time_duration.sum"]) / 1000.0 / steps  # ns -> us
        count[name] += 1 / steps
    total = sum(time.values())
    for name, us in sorted(time.items(), key=lambda kv: -kv[1]):
        print(f"{us:9.1f} us  {count[name]:6.1f}x  {name}")
    print(f"{total:9.1f} us per step ({len(tail)} kernels over {steps} steps)")


if __name__ == "__main__":
    main()
