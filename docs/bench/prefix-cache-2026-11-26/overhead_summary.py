#!/usr/bin/env python3
"""Summarizes overhead.sh's JSON: tokens/s per (model, mode, batch), on vs off, median ratio.

  overhead_summary.py OUT_DIR
"""
import glob
import json
import os
import statistics
import sys

d = sys.argv[1]
rows = {}
for pc in ("on", "off"):
    for path in sorted(glob.glob(os.path.join(d, pc + "[0-9].json"))):
        for run in json.load(open(path))["runs"]:
            s = run["stats"]
            key = (os.path.basename(run["model"]["dir"]), run["mode"], s["max_batch_rows"])
            rows.setdefault(key, {"on": [], "off": []})[pc].append(s["tokens_per_s"])
print(f"{'model':8} {'mode':9} {'batch':>5}  {'off tok/s':>40}  {'on tok/s':>40}  on/off median")
for key in sorted(rows):
    on, off = rows[key]["on"], rows[key]["off"]
    fmt = lambda v: " ".join(f"{x:6.1f}" for x in v)
    print(f"{key[0]:8} {key[1]:9} {key[2]:>5}  {fmt(off):>40}  {fmt(on):>40}  "
          f"{statistics.median(on) / statistics.median(off):.3f}")
