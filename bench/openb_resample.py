#!/usr/bin/env python3
"""Writes an openb trace variant with a different task mix, drawn from the default pod list.

Usage: bench/openb_resample.py <trace dir> <out dir> <name> <share weight> <multi-GPU weight> [seed]

Copies the node list and writes `openb_pod_list_<name>.csv`: as many tasks as the default
pod list, drawn from it at random with replacement (seeded, default 1), a task that asks for a
share of one GPU drawn <share weight> times as often as the others and a task that asks for
several whole GPUs <multi-GPU weight> times as often. Every drawn row keeps its columns (CPU,
memory, GPU ask, gpu_spec) and gets a fresh name. `2 3` gives a trace with about twice the
sharing and three times the multi-GPU tasks. Replay it with `OPENB_DIR=<out dir>
OPENB_TRACE=openb_pod_list_<name>.csv` and check it with `bench/check_openb.py <out dir>
<placements> openb_pod_list_<name>.csv`.
"""

import csv
import os
import random
import shutil
import sys


def main():
    if len(sys.argv) not in (6, 7):
        raise SystemExit(__doc__)
    trace_dir, out_dir, name = sys.argv[1], sys.argv[2], sys.argv[3]
    share_weight, multi_weight = float(sys.argv[4]), float(sys.argv[5])
    rng = random.Random(int(sys.argv[6]) if len(sys.argv) == 7 else 1)
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(trace_dir, "openb_node_list_gpu_node.csv"), out_dir)
    with open(os.path.join(trace_dir, "openb_pod_list_default.csv"), newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)

    def weight(row):
        gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        if gpus == 1 and 0 < milli < 1000:
            return share_weight
        if gpus > 1 and milli > 0:
            return multi_weight
        return 1.0

    drawn = rng.choices(rows, [weight(r) for r in rows], k=len(rows))
    out = os.path.join(out_dir, f"openb_pod_list_{name}.csv")
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for i, row in enumerate(drawn):
            writer.writerow({**row, "name": f"openb-pod-{name}-{i:04d}"})
    shares = sum(1 for r in drawn if weight(r) == share_weight and int(r["num_gpu"]) == 1)
    multi = sum(1 for r in drawn if int(r["num_gpu"]) > 1 and int(r["gpu_milli"]) > 0)
    print(f"{out}: {len(drawn)} tasks, {shares} shares, {multi} multi-GPU")


if __name__ == "__main__":
    main()
