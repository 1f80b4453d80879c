"""Starts one trainer.py per entry of TRAINPROF_TEST_RANKS (a JSON list of parameter
overrides), with RANK set, and waits for all: a two-rank job on one host."""

import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ranks = json.loads(os.environ["TRAINPROF_TEST_RANKS"])
base = json.loads(os.environ.get("TRAINPROF_TEST_PARAMS") or "{}")
procs = []
for rank, override in enumerate(ranks):
    env = dict(os.environ)
    env["RANK"] = str(rank)
    env["TRAINPROF_TEST_PARAMS"] = json.dumps({**base, **override})
    env["TRAINPROF_TEST_MANIFEST"] = os.environ["TRAINPROF_TEST_MANIFEST"] + f".{rank}"
    procs.append(subprocess.Popen([sys.executable, str(HERE / "trainer.py")], env=env))
sys.exit(max(p.wait() for p in procs))
