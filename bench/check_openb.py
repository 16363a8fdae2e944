#!/usr/bin/env python3
"""Independent check of the openb replay (BENCHMARKS.md, "openb replay").

Reads the trace's two CSV files and the files `cargo bench -p berth-domain --bench
openb_replay` writes with OPENB_PLACEMENTS=<dir>, and re-validates every placement without
any of the replay's code (this is Python on purpose: nothing to share with the Rust):

- the workload: every arrival is a task of the trace (tuned draws as `<task>-tuned-<n>`), the
  first arrivals are every trace task exactly once, and the whole asks at most 1.3 x the
  fleet's GPU milli;
- each placement, in arrival order with nothing leaving: the node exists; its CPU and memory
  are never over-committed; a CPU-only task takes no GPU; a whole-GPU task of n GPUs takes n
  distinct GPUs of that node, each entirely free, at 1000 milli each; a share takes one GPU
  with its milli free, at exactly the milli asked; no GPU ever holds more than 1000 milli;
  a GPU task naming GPU models (`gpu_spec`, `|`-separated) lands on a node of one of them
  (the default trace names none; the variants, e.g. `openb_pod_list_gpuspec33.csv`, do);
- each skipped task really fit nowhere at its arrival (CPU, memory and GPU, as above);
- the figures: allocated GPU milli over the fleet's after each arrival, read at 100% arrival
  (the first arrival whose arrived ask reaches capacity, and the mean over arrivals at
  99.5..=100.5%) and at the end, and placed and skipped counts, equal what the replay
  reported for that run (`replay.csv`).

The MIG part (`mig-placements-*.csv`, `mig-replay.csv`): the same workload on the same nodes,
every GPU an H100-80GB. A share becomes the smallest of 1g/2g/3g/4g/7g with at least
ceil(milli * 7 / 1000) compute slices; whole GPUs stay whole. Checked as NVIDIA's MIG user
guide gives the H100's geometry (profile -> compute slices, memory slices, allowed starts):
CPU and memory as above; an instance's profile is the one its share rounds to, at an allowed
start, on a GPU not taken whole, its memory slices overlapping no other instance's, the GPU's
compute slices at most 7 and no profile above its count per GPU; a whole-GPU task takes GPUs
with no instance; a skipped task fit nowhere; allocated compute slices (7 per whole GPU) at
100% arrival and at the end, and the counts, equal what the replay reported.

Usage: bench/check_openb.py <trace dir> <placements dir> [pod list file, default $OPENB_TRACE or
openb_pod_list_default.csv]
Prints one line per run and exits 1 on the first kind of violation found in any run.
"""

import csv
import glob
import os
import re
import sys

MILLI_PER_GPU = 1000
TUNING_RATIO = 1.3


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_trace(trace_dir, pods):
    nodes = {}
    for row in read_rows(os.path.join(trace_dir, "openb_node_list_gpu_node.csv")):
        nodes[row["sn"]] = {
            "cpu": int(row["cpu_milli"]),
            "memory": int(row["memory_mib"]),
            "gpus": int(row["gpu"]),
            "model": row.get("model", ""),
        }
    tasks = {}
    for row in read_rows(os.path.join(trace_dir, pods)):
        num_gpu, gpu_milli = int(row["num_gpu"]), int(row["gpu_milli"])
        if num_gpu == 0 or gpu_milli == 0:
            kind, count, milli = "cpu", 0, 0
        elif num_gpu == 1 and gpu_milli < MILLI_PER_GPU:
            kind, count, milli = "share", 1, gpu_milli
        elif gpu_milli == MILLI_PER_GPU:
            kind, count, milli = "whole", num_gpu, MILLI_PER_GPU
        else:
            raise SystemExit(f"{row['name']}: {num_gpu} GPUs of {gpu_milli} milli is no task the replay knows")
        spec = [m for m in (row.get("gpu_spec") or "").split("|") if m]
        tasks[row["name"]] = {
            "cpu": int(row["cpu_milli"]),
            "memory": int(row["memory_mib"]),
            "kind": kind,
            "count": count,
            "milli": milli,
            "models": spec,
        }
    return nodes, tasks


def fits(task, node, state):
    """Whether `task` fits the node in `state` (free cpu, memory, per-GPU milli)."""
    if state["cpu"] < task["cpu"] or state["memory"] < task["memory"]:
        return False
    if task["kind"] != "cpu" and task["models"] and node["model"] not in task["models"]:
        return False
    if task["kind"] == "share":
        return any(free >= task["milli"] for free in state["gpu_free"])
    if task["kind"] == "whole":
        return sum(1 for free in state["gpu_free"] if free == MILLI_PER_GPU) >= task["count"]
    return True


def check_run(path, nodes, tasks, reported):
    errors = []

    def fail(message):
        if len(errors) < 10:
            errors.append(message)

    capacity = sum(n["gpus"] for n in nodes.values()) * MILLI_PER_GPU
    state = {
        name: {"cpu": n["cpu"], "memory": n["memory"], "gpu_free": [MILLI_PER_GPU] * n["gpus"]}
        for name, n in nodes.items()
    }
    arrived = allocated = placed = skipped = 0
    at_full, window = None, []
    seen_originals = set()
    originals_done = False
    rows = read_rows(path)
    for number, row in enumerate(rows):
        where = f"{os.path.basename(path)} arrival {row['arrival']}"
        if int(row["arrival"]) != number:
            fail(f"{where}: arrivals out of order")
        base = re.sub(r"-tuned-\d+$", "", row["task"])
        task = tasks.get(base)
        if task is None:
            fail(f"{where}: {row['task']} is no task of the trace")
            continue
        if base == row["task"]:
            if originals_done or base in seen_originals:
                fail(f"{where}: {base} arrives as an original twice or after the tuned draws began")
            seen_originals.add(base)
        else:
            originals_done = True
        arrived += task["count"] * task["milli"]
        if not row["node"]:
            skipped += 1
            for node_name, node in nodes.items():
                if fits(task, node, state[node_name]):
                    fail(f"{where}: {row['task']} was skipped but fits {node_name}")
                    break
        else:
            node = nodes.get(row["node"])
            if node is None:
                fail(f"{where}: no node {row['node']}")
                continue
            s = state[row["node"]]
            gpus = [int(g) for g in row["gpu_indexes"].split("-")] if row["gpu_indexes"] else []
            milli = int(row["gpu_milli_per_gpu"] or 0)
            if task["kind"] != "cpu" and task["models"] and node["model"] not in task["models"]:
                fail(f"{where}: {row['task']} asks for {task['models']}, {row['node']} is {node['model']}")
            s["cpu"] -= task["cpu"]
            s["memory"] -= task["memory"]
            if s["cpu"] < 0 or s["memory"] < 0:
                fail(f"{where}: {row['node']} over-committed (cpu {s['cpu']}, memory {s['memory']} left)")
            if len(set(gpus)) != len(gpus) or any(g < 0 or g >= node["gpus"] for g in gpus):
                fail(f"{where}: GPUs {gpus} are not distinct GPUs of {row['node']} ({node['gpus']} GPUs)")
                continue
            if task["kind"] == "cpu" and gpus:
                fail(f"{where}: a CPU-only task took GPUs {gpus}")
            if task["kind"] == "share" and (len(gpus) != 1 or milli != task["milli"]):
                fail(f"{where}: a share of {task['milli']} milli placed as {gpus} x {milli}")
            if task["kind"] == "whole":
                if len(gpus) != task["count"] or milli != MILLI_PER_GPU:
                    fail(f"{where}: {task['count']} whole GPUs placed as {gpus} x {milli}")
                if any(s["gpu_free"][g] != MILLI_PER_GPU for g in gpus):
                    fail(f"{where}: a whole-GPU task on a GPU already in use ({gpus})")
            for g in gpus:
                s["gpu_free"][g] -= milli
                if s["gpu_free"][g] < 0:
                    fail(f"{where}: GPU {g} of {row['node']} above {MILLI_PER_GPU} milli")
            allocated += milli * len(gpus)
            placed += 1
        rate = allocated / capacity
        if at_full is None and arrived >= capacity:
            at_full = rate
        if capacity * 995 <= arrived * 1000 <= capacity * 1005:
            window.append(rate)
    # Tuned draws come after the whole trace (a trace asking more than the target is cut
    # down instead, and has none).
    if originals_done and len(seen_originals) != len(tasks):
        fail(f"{len(tasks) - len(seen_originals)} trace tasks never arrived before the tuned draws")
    if arrived > TUNING_RATIO * capacity:
        fail(f"the workload asks {arrived} GPU milli, over {TUNING_RATIO} x {capacity}")

    ours = {
        "placed": placed,
        "skipped": skipped,
        "around_full": sum(window) / len(window) if window else None,
        "at_full": at_full,
        "at_end": allocated / capacity,
    }
    if reported is None:
        fail("the replay reported no figures for this run (replay.csv)")
    else:
        for key, value in ours.items():
            theirs = reported[key]
            same = (value is None and theirs == "") or (
                value is not None and theirs != "" and abs(float(theirs) - value) <= 1e-12
            )
            if not same:
                fail(f"{key}: the replay reported {theirs}, the placements give {value}")
    return ours, errors


# H100-80GB MIG profiles (NVIDIA MIG user guide): compute slices, memory slices (of 8),
# allowed starts, most instances per GPU.
MIG_PROFILES = {
    "1g.10gb": (1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    "2g.20gb": (2, 2, (0, 2, 4), 3),
    "3g.40gb": (3, 4, (0, 4), 2),
    "4g.40gb": (4, 4, (0,), 1),
    "7g.80gb": (7, 8, (0,), 1),
}
COMPUTE_SLICES = 7


def mig_profile_for(milli):
    slices = -(-milli * COMPUTE_SLICES // MILLI_PER_GPU)
    return min((p for p, v in MIG_PROFILES.items() if v[0] >= slices), key=lambda p: MIG_PROFILES[p][0])


def mig_room(gpu, profile):
    """The starts at which an instance of `profile` fits the GPU `gpu` (whole flag, instances)."""
    if gpu["whole"]:
        return []
    compute, memory, starts, most = MIG_PROFILES[profile]
    if sum(MIG_PROFILES[p][0] for p, _ in gpu["instances"]) + compute > COMPUTE_SLICES:
        return []
    if sum(1 for p, _ in gpu["instances"] if p == profile) >= most:
        return []
    taken = set()
    for p, start in gpu["instances"]:
        taken.update(range(start, start + MIG_PROFILES[p][1]))
    return [s for s in starts if not taken & set(range(s, s + memory))]


def check_mig_run(path, nodes, tasks, reported):
    errors = []

    def fail(message):
        if len(errors) < 10:
            errors.append(message)

    total = sum(n["gpus"] for n in nodes.values()) * COMPUTE_SLICES
    state = {
        name: {
            "cpu": n["cpu"],
            "memory": n["memory"],
            "gpus": [{"whole": False, "instances": []} for _ in range(n["gpus"])],
        }
        for name, n in nodes.items()
    }

    def fits(task, s):
        if s["cpu"] < task["cpu"] or s["memory"] < task["memory"]:
            return False
        if task["kind"] == "share":
            return any(mig_room(g, mig_profile_for(task["milli"])) for g in s["gpus"])
        if task["kind"] == "whole":
            return sum(1 for g in s["gpus"] if not g["whole"] and not g["instances"]) >= task["count"]
        return True

    arrived = allocated = placed = skipped = 0
    at_full = None
    for number, row in enumerate(read_rows(path)):
        where = f"{os.path.basename(path)} arrival {row['arrival']}"
        if int(row["arrival"]) != number:
            fail(f"{where}: arrivals out of order")
        task = tasks.get(re.sub(r"-tuned-\d+$", "", row["task"]))
        if task is None:
            fail(f"{where}: {row['task']} is no task of the trace")
            continue
        want = mig_profile_for(task["milli"]) if task["kind"] == "share" else None
        arrived += MIG_PROFILES[want][0] if want else COMPUTE_SLICES * task["count"]
        if not row["node"]:
            skipped += 1
            fitting = next((n for n, s in state.items() if fits(task, s)), None)
            if fitting:
                fail(f"{where}: {row['task']} was skipped but fits {fitting}")
        elif row["node"] not in nodes:
            fail(f"{where}: no node {row['node']}")
            continue
        else:
            s = state[row["node"]]
            gpus = [int(g) for g in row["gpu_indexes"].split("-")] if row["gpu_indexes"] else []
            s["cpu"] -= task["cpu"]
            s["memory"] -= task["memory"]
            if s["cpu"] < 0 or s["memory"] < 0:
                fail(f"{where}: {row['node']} over-committed (cpu {s['cpu']}, memory {s['memory']} left)")
            if len(set(gpus)) != len(gpus) or any(g < 0 or g >= len(s["gpus"]) for g in gpus):
                fail(f"{where}: GPUs {gpus} are not distinct GPUs of {row['node']}")
                continue
            if task["kind"] == "cpu" and (gpus or row["profile"]):
                fail(f"{where}: a CPU-only task took GPUs {gpus} {row['profile']}")
            if task["kind"] == "whole":
                if len(gpus) != task["count"] or row["profile"]:
                    fail(f"{where}: {task['count']} whole GPUs placed as {gpus} {row['profile']}")
                for g in gpus:
                    gpu = s["gpus"][g]
                    if gpu["whole"] or gpu["instances"]:
                        fail(f"{where}: whole GPU {g} of {row['node']} is in use")
                    gpu["whole"] = True
                allocated += COMPUTE_SLICES * len(gpus)
            if task["kind"] == "share":
                if len(gpus) != 1 or row["profile"] != want:
                    fail(f"{where}: a share of {task['milli']} milli (a {want}) placed as {gpus} {row['profile']}")
                    continue
                gpu, start = s["gpus"][gpus[0]], int(row["start"])
                if start not in mig_room(gpu, want):
                    fail(f"{where}: {want} at {start} does not fit GPU {gpus[0]} of {row['node']} {gpu}")
                gpu["instances"].append((want, start))
                allocated += MIG_PROFILES[want][0]
            placed += 1
        if at_full is None and arrived >= total:
            at_full = (allocated, skipped)

    ours = {
        "placed": placed,
        "skipped": skipped,
        "allocated_at_full": at_full[0] if at_full else None,
        "skipped_at_full": at_full[1] if at_full else None,
        "allocated_at_end": allocated,
        "total": total,
    }
    if reported is None:
        fail("the replay reported no figures for this run (mig-replay.csv)")
    else:
        for key, value in ours.items():
            if str(value) != reported[key]:
                fail(f"{key}: the replay reported {reported[key]}, the placements give {value}")
    return ours, errors


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    trace_dir, placements_dir = sys.argv[1], sys.argv[2]
    # The pod list the replay read (its OPENB_TRACE); the default trace unless named.
    pods = sys.argv[3] if len(sys.argv) == 4 else os.environ.get("OPENB_TRACE", "openb_pod_list_default.csv")
    nodes, tasks = read_trace(trace_dir, pods)
    bad = 0
    for prefix, summary, check in [("", "replay.csv", check_run), ("mig-", "mig-replay.csv", check_mig_run)]:
        reported = {}
        if os.path.exists(os.path.join(placements_dir, summary)):
            for row in read_rows(os.path.join(placements_dir, summary)):
                reported[(row["policy"], row["seed"])] = row
        files = sorted(glob.glob(os.path.join(placements_dir, f"{prefix}placements-*-seed*.csv")))
        if not files and not prefix:
            raise SystemExit(f"no placements files in {placements_dir}")
        for path in files:
            policy, seed = re.match(rf"{prefix}placements-(.+)-seed(\d+)\.csv$", os.path.basename(path)).groups()
            ours, errors = check(path, nodes, tasks, reported.get((policy, seed)))
            if prefix:
                figure = f"compute slices allocated at 100% arrival {ours['allocated_at_full']}"
            else:
                around = ours["around_full"]
                figure = f"allocation at 100% arrival {'-' if around is None else f'{100 * around:.2f}%'}"
            print(
                f"{prefix + policy:<18} seed {seed}: {ours['placed']} placed, {ours['skipped']} skipped, "
                f"{figure}: {'ok' if not errors else 'WRONG'}"
            )
            for e in errors:
                print(f"  {e}")
            bad += bool(errors)
        if len(reported) != len(files):
            print(f"{summary} names {len(reported)} runs, {len(files)} placements files were written")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
