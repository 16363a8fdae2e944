#!/usr/bin/env python3
"""Writes an openb trace variant whose GPU tasks name GPU models, like the `gpu_spec`
variants published with the FGD paper's simulator (which are not in shared/data).

Usage: bench/openb_variant.py <trace dir> <out dir> <percent> [seed]

Copies the node list and writes `openb_pod_list_gpuspec<percent>.csv`: the default pod list
with `gpu_spec` set on <percent>% of the tasks that ask for GPUs (chosen with the seed), each
naming one model family drawn in proportion to the GPUs the fleet has of it: `G2`, `T4`,
`P100`, `V100M16|V100M32`, `G3` or `A10`. Every other column is unchanged. Replay it with
`OPENB_DIR=<out dir> OPENB_TRACE=openb_pod_list_gpuspec<percent>.csv` and check it with
`bench/check_openb.py <out dir> <placements> openb_pod_list_gpuspec<percent>.csv`.
"""

import csv
import os
import random
import shutil
import sys


def main():
    if len(sys.argv) not in (4, 5):
        raise SystemExit(__doc__)
    trace_dir, out_dir, percent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) == 5 else 1)
    os.makedirs(out_dir, exist_ok=True)
    nodes = os.path.join(trace_dir, "openb_node_list_gpu_node.csv")
    shutil.copy(nodes, out_dir)
    gpus = {}
    with open(nodes, newline="") as f:
        for row in csv.DictReader(f):
            gpus[row["model"]] = gpus.get(row["model"], 0) + int(row["gpu"])
    families = [["G2"], ["T4"], ["P100"], ["V100M16", "V100M32"], ["G3"], ["A10"]]
    weights = [sum(gpus.get(m, 0) for m in family) for family in families]
    with open(os.path.join(trace_dir, "openb_pod_list_default.csv"), newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    gpu_tasks = [r for r in rows if int(r["num_gpu"]) > 0 and int(r["gpu_milli"]) > 0]
    for row in rng.sample(gpu_tasks, len(gpu_tasks) * percent // 100):
        row["gpu_spec"] = "|".join(rng.choices(families, weights)[0])
    out = os.path.join(out_dir, f"openb_pod_list_gpuspec{percent}.csv")
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    named = sum(1 for r in rows if r["gpu_spec"])
    print(f"{out}: {named} of {len(gpu_tasks)} GPU tasks name models")


if __name__ == "__main__":
    main()
