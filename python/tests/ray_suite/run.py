"""Runs Ray Train v2's own tests against trainyard (through ``shim/ray``) and, for the
yardstick, against Ray itself; prints each test's two outcomes and the counts.

    python run.py --ray-source DIR [--against both|trainyard|ray] [--only NAME] [--out FILE]
                  [PYTEST_ARGS...]

DIR is a folder outside this repository laid out as Ray's (``DIR/python/ray/train/v2/tests/
test_*.py``, ``DIR/python/ray/train/tests/*.py``, ``DIR/python/ray/train/examples/...``):
single files of Ray's repository, fetched by hand. Ray's files are never copied into this
repository; the test files are copied into a scratch folder beside this folder's
``conftest.py`` and run there. ``cargo xtask ray-tests`` is the usual way in (it finds the
Python and the ``trainyard`` binary).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_PYTHON = os.path.dirname(os.path.dirname(HERE))
# The most one file's tests may take (a test that waits forever is stopped, and reported so).
FILE_LIMIT_S = 900


def _run(
    against: str, source: str, extra: List[str], scratch: str, only: List[str]
) -> Dict[str, Dict[str, str]]:
    tests = os.path.join(source, "python", "ray", "train", "v2", "tests")
    files = sorted(glob.glob(os.path.join(tests, "test_*.py")))
    if not files:
        raise SystemExit(f"no test_*.py under {tests}: is --ray-source laid out as Ray's?")
    folder = os.path.join(scratch, against)
    os.makedirs(folder)
    for path in files:
        shutil.copy(path, folder)
    shutil.copy(os.path.join(HERE, "conftest.py"), folder)
    results = os.path.join(scratch, f"{against}.json")
    env = dict(os.environ)
    env.update(
        RAY_SUITE_AGAINST=against,
        RAY_SUITE_RESULTS=results,
        RAY_SUITE_SOURCE=os.path.join(source, "python"),
        HF_HUB_OFFLINE="1",
    )
    paths = [os.path.join(HERE, "shim"), REPO_PYTHON] if against == "trainyard" else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [folder])
    started = time.monotonic()
    print(f"--- {against}: {len(files)} files of Ray's v2 tests", flush=True)
    outcomes: Dict[str, Dict[str, str]] = {}
    # One process per file, as Ray's CI runs them (a test that starts Ray and leaves it
    # running would fail the next file's ray.init).
    for path in files:
        name = os.path.basename(path)
        if only and not any(part in name for part in only):
            continue
        pytest = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", *extra, name],
            cwd=folder,
            env=env,
            start_new_session=True,
        )
        try:
            pytest.wait(timeout=FILE_LIMIT_S)
        except subprocess.TimeoutExpired:
            print(f"--- {name}: still running after {FILE_LIMIT_S} s: stopped", flush=True)
            os.killpg(pytest.pid, signal.SIGKILL)
            pytest.wait()
        if os.path.exists(results):
            with open(results, encoding="utf-8") as f:
                outcomes.update(json.load(f))
            os.remove(results)
    print(f"--- {against}: {time.monotonic() - started:.0f} s", flush=True)
    return outcomes


def _counts(outcomes: Dict[str, Dict[str, str]]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for entry in outcomes.values():
        counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    return counts


def _report(results: Dict[str, Dict[str, Dict[str, str]]]) -> Dict[str, object]:
    names = sorted({n for outcomes in results.values() for n in outcomes})
    rows = []
    for name in names:
        row = {"test": name.split("/")[-1]}
        for against, outcomes in results.items():
            entry = outcomes.get(name, {"outcome": "absent", "reason": ""})
            row[against] = entry["outcome"]
            row[f"{against}_reason"] = entry["reason"]
        rows.append(row)
    summary: Dict[str, object] = {k: _counts(v) for k, v in results.items()}
    if "ray" in results and "trainyard" in results:
        yardstick = [r for r in rows if r["ray"] == "passed"]
        applicable = [r for r in yardstick if r["trainyard"] != "not applicable"]
        passed = [r for r in applicable if r["trainyard"] == "passed"]
        summary["passing on Ray"] = len(yardstick)
        summary["of those, applicable to trainyard"] = len(applicable)
        summary["of those, passing on trainyard"] = len(passed)
    return {"summary": summary, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray-source", required=True, help="a folder laid out as Ray's repo")
    parser.add_argument("--against", choices=("both", "trainyard", "ray"), default="both")
    parser.add_argument("--out", help="write the report as JSON here too")
    parser.add_argument(
        "--only", action="append", default=[], help="run only the files whose name holds this"
    )
    args, extra = parser.parse_known_args()
    source = os.path.abspath(args.ray_source)
    if os.path.abspath(source).startswith(os.path.dirname(REPO_PYTHON) + os.sep):
        raise SystemExit("--ray-source must be outside this repository (Ray's files stay out)")
    modes = ["ray", "trainyard"] if args.against == "both" else [args.against]
    with tempfile.TemporaryDirectory(prefix="ray-suite-") as scratch:
        results = {mode: _run(mode, source, extra, scratch, args.only) for mode in modes}
    report = _report(results)
    for row in report["rows"]:  # type: ignore[union-attr]
        cells = "  ".join(f"{mode}={row[mode]}" for mode in modes)
        reasons = "; ".join(
            f"{mode}: {row[mode + '_reason']}" for mode in modes if row[mode + "_reason"]
        )
        print(f"{row['test']:<90} {cells}{'  -- ' + reasons if reasons else ''}")
    print(json.dumps(report["summary"], indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
