#!/usr/bin/env bash
# What clock and power each bench row runs at (docs/PERFORMANCE.md, session 29): samples
# nvidia-smi every 20 ms while `cellm bench` runs one row, then prints, for the samples of
# the row's TG phase (the last T_TG seconds of samples above IDLE_W, default 150 W), the
# median SM clock and power, and the share of samples the driver held the clock down for
# its power cap (clocks_throttle_reasons.active bit 0x4, SW power cap). One row (one -npl
# value) a run, so that its TG phase is the run's last busy stretch. Needs a build in
# /tmp/cellm-build (bench/gpu_visit.sh none, or `. bench/bench_row.sh; visit_build`).
#   bash bench/power_visit.sh "NAME:BENCH ARGS" ...
# e.g. bash bench/power_visit.sh "long128:--preset 8b -npp 1024 -ntg 256 -npl 128"
# Results under $OUT: power_NAME.csv (the samples) and power.txt (the summaries).
set -uo pipefail
OUT=${OUT:-/tmp/cellm-out}
mkdir -p "$OUT"
B=/tmp/cellm-build
for row in "$@"; do
  name=${row%%:*}
  # shellcheck disable=SC2206
  args=(${row#*:})
  csv=$OUT/power_$name.csv
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 20 >"$csv" &
  sampler=$!
  result=$(timeout 300 $B/cellm bench --executor cuda --peak-bandwidth 4250 "${args[@]}" 2>&1 |
    grep -E "^\| +[0-9]")
  sleep 0.3
  kill $sampler
  t_tg=$(echo "$result" | awk -F'|' 'NR == 1 {print $8}')
  python3 - "$csv" "${IDLE_W:-150}" "$name" "${t_tg:-0}" <<'PY' | tee -a "$OUT/power.txt"
import statistics, sys
path, idle, name, t_tg = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
busy = []
for line in open(path):
    f = [x.strip() for x in line.split(",")]
    try:
        busy.append((int(f[1]), float(f[3]), int(f[4], 16)))
    except (IndexError, ValueError):
        continue
while busy and busy[-1][1] <= idle:  # the idle samples after the run
    busy.pop()
busy = busy[-max(1, int(t_tg / 0.02)):]  # the TG phase: the last T_TG seconds, 20 ms a sample
if not busy:
    print(f"{name}: no samples")
else:
    capped = sum(1 for b in busy if b[2] & 0x4) / len(busy)
    print(f"{name} TG: {len(busy)} samples, SM clock median {statistics.median(b[0] for b in busy)} MHz "
          f"(min {min(b[0] for b in busy)}), power median {statistics.median(b[1] for b in busy):.0f} W "
          f"(max {max(b[1] for b in busy):.0f}), power-capped {100 * capped:.0f}% of them")
PY
  echo "$result" | tee -a "$OUT/power.txt"
done
