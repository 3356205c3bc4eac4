#!/usr/bin/env python3
"""Groups an `ncu --csv --page raw` profile of `cellm bench` by kernel.

Usage: ncu_summary.py PROFILE.csv [STEPS]
A step ends with the sampler's last kernel (row_draw); the last STEPS (default 2)
complete steps are averaged. Prints, per kernel name, launches and microseconds
per step, largest first, and the step's total. Kernels are timed one at a time
under ncu, so small kernels read a little slower than inside a graph replay.
"""
import collections
import csv
import sys


def main() -> None:
    path = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = [
        r for r in csv.DictReader(lines)
        if r.get("gpu__time_duration.sum", "").replace(",", "").replace(".", "").isdigit()
    ]
    ends = [i for i, r in enumerate(rows) if "row_draw" in r["Kernel Name"]]
    if len(ends) < steps + 1:
        sys.exit(f"{path}: only {len(ends)} step ends found")
    window = rows[ends[-steps - 1] + 1:ends[-1] + 1]
    time = collections.defaultdict(float)
    count = collections.Counter()
    for r in window:
        name = r["Kernel Name"].split("(")[0][:80]
        time[name] += float(r["gpu__time_duration.sum"].replace(",", "")) / 1000.0 / steps
        count[name] += 1 / steps
    for name, us in sorted(time.items(), key=lambda kv: -kv[1]):
        print(f"{us:9.1f} us  {count[name]:6.1f}x  {name}")
    print(f"{sum(time.values()):9.1f} us per step ({len(window)} kernels over {steps} steps)")


if __name__ == "__main__":
    main()
