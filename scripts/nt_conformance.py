"""neural-tangents 0.6.5's own test suite, run unchanged against `smnngp.nt` (and against nt itself).

    python scripts/nt_conformance.py                 # ours: every file below, nt's counts from its record
    python scripts/nt_conformance.py --nt            # also rerun nt's tests on nt (needs .venv-oracle)
    python scripts/nt_conformance.py stax/linear_test.py predict_test.py -k Conv

What it does:
1. fetches nt 0.6.5's source distribution from PyPI through the data registry (SHA-256 checked, cached under
   ``$SMNNGP_CACHE_DIR``, never committed) and extracts its ``tests/`` next to it;
2. runs pytest on nt's test files (unchanged) with ``scripts/nt_conformance/shim`` first on ``PYTHONPATH``: a
   package named ``neural_tangents`` that re-exports `smnngp.nt` plus the few private names nt's test files
   import (``_src.utils.utils``' axis helpers, ``_src.predict._is_on_cpu``, a testing constant);
3. with ``--nt``, runs the same files on neural-tangents 0.6.5 itself in its pinned environment
   (``$SMNNGP_ORACLE_VENV``, default ``.venv-oracle``: ``bash scripts/make_golden.sh`` builds it, plus
   ``pip install absl-py more-itertools pytest pytest-xdist flax==0.7.5``) and records its counts in
   ``records/conformance/nt_own.json``;
4. prints nt's counts beside ours, file by file, and every failure of ours either as *listed* (named, with its
   reason, in the table "nt's own tests: the exceptions" of docs/neural-tangents.md) or as UNEXPLAINED; writes
   ``records/conformance/smnngp.json``. Exit status 1 when a failure is unexplained.

Both runs load the plugin in ``scripts/nt_conformance/plugin`` (absl flags marked parsed; ``jax.tree_map`` put
back on a jax that removed it; nt's random bits) and see two CPU devices
(``--xla_force_host_platform_device_count=2``). Counts are pytest's test ids: one per parameterised case that
nt's ``test_utils.product`` samples (``NT_NUM_GENERATED_CASES``, default 4, as nt's own CI).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.data.registry import DataFile, cache_dir, fetch_file  # noqa: E402

HERE = ROOT / "scripts" / "nt_conformance"
DOC = ROOT / "docs" / "neural-tangents.md"
RECORDS = ROOT / "records" / "conformance"
SDIST = DataFile(
    path="pypi/neural-tangents-0.6.5.tar.gz",
    source="pypi",
    remote="d7/20/01d85a1bc739488ee87c06d22d3bfee9042c8e813cea7adc0969dc7e034b/neural-tangents-0.6.5.tar.gz",
    sha256="5565190e5b20c8578b2c8fbf1498ad9d8f6881c8c702e7af55189707a10843c3",
    parser=lambda p: p,
)
FILES = [
    "stax/branching_test.py", "stax/combinators_test.py", "stax/elementwise_test.py", "stax/linear_test.py",
    "stax/requirements_test.py", "stax/stax_test.py",
    "predict_test.py", "batching_test.py", "monte_carlo_test.py", "empirical_test.py",
]
EXCEPTIONS_HEADING = "## nt's own tests: the exceptions"


def nt_tests() -> Path:
    """The folder holding nt 0.6.5's ``tests/`` package, extracted once from the verified sdist."""
    archive = fetch_file(SDIST)
    dest = cache_dir() / "pypi" / "neural-tangents-0.6.5-tests"
    if not (dest / "tests" / "test_utils.py").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and "/tests/" in m.name]
            for m in members:
                m.name = m.name.split("/", 1)[1]  # neural-tangents-0.6.5/tests/... -> tests/...
            tar.extractall(dest, members=members, filter="data")
    return dest


def exceptions() -> list[tuple[str, str]]:
    """(test-id pattern, reason) rows of the exceptions table in docs/neural-tangents.md."""
    text = DOC.read_text()
    if EXCEPTIONS_HEADING not in text:
        raise SystemExit(f"{DOC} has no section {EXCEPTIONS_HEADING!r}")
    section = text.split(EXCEPTIONS_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*(.+?)\s*\|\s*$", line)
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


def run_pytest(python: str, src: Path, files: list[str], xml: Path, shim: bool, workers: int,
               extra: list[str]) -> int:
    env = dict(os.environ)
    paths = [str(HERE / "plugin"), str(src)]
    if shim:
        paths.insert(0, str(HERE / "shim"))
        paths.append(str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("NT_NUM_GENERATED_CASES", "4")
    env.setdefault("JAX_PLATFORMS", "cpu")
    # Two CPU devices, so that nt's tests of device_count=2 (which nt itself fakes by stubbing its private pmap)
    # run on two real devices here.
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    cmd = [python, "-m", "pytest", "-p", "nt_conformance_plugin", "-p", "no:cacheprovider", "-q",
           "--rootdir", str(src), "-o", "addopts=", "--junitxml", str(xml), "-W", "ignore::DeprecationWarning",
           "--tb=line"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    cmd += [f"tests/{f}" for f in files] + extra
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=src, env=env)


def read_junit(xml: Path) -> dict[str, dict]:
    """{file: {'passed': n, 'skipped': n, 'failed': [test ids]}} from pytest's junit xml."""
    out: dict[str, dict] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        cls = case.get("classname", "")
        if cls:  # classname 'tests.stax.linear_test.ConvTest' -> file 'stax/linear_test.py', class 'ConvTest'
            parts = cls.split(".")
            file = "/".join(parts[1:-1]) + ".py"
            test_id = f"{file}::{parts[-1]}::{case.get('name')}"
        else:  # a module that failed to import: name 'tests.stax.linear_test'
            file = "/".join(case.get("name", "").split(".")[1:]) + ".py"
            test_id = f"{file}::(collection)"
        entry = out.setdefault(file, {"passed": 0, "skipped": 0, "failed": []})
        if case.find("failure") is not None or case.find("error") is not None:
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            entry["failed"].append({"id": test_id, "message": (node.get("message") or "")[:300]})
        elif case.find("skipped") is not None:
            entry["skipped"] += 1
        else:
            entry["passed"] += 1
    return out


def side(python: str, src: Path, files: list[str], name: str, shim: bool, workers: int,
         extra: list[str]) -> dict:
    xml = cache_dir() / "pypi" / f"nt-conformance-{name}.xml"
    t0 = time.perf_counter()
    run_pytest(python, src, files, xml, shim, workers, extra)
    result = {"files": read_junit(xml), "seconds": round(time.perf_counter() - t0, 1)}
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("files", nargs="*", help=f"nt test files under tests/ (default: {' '.join(FILES)})")
    ap.add_argument("--nt", action="store_true", help="also run the files on neural-tangents 0.6.5 itself")
    ap.add_argument("--no-ours", action="store_true", help="skip the run on smnngp.nt")
    ap.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    ap.add_argument("-k", default=None, help="pytest -k expression (a partial run records nothing)")
    args = ap.parse_args(argv)
    files = args.files or FILES
    extra = ["-k", args.k] if args.k else []
    partial = bool(args.files or args.k)
    src = nt_tests()
    RECORDS.mkdir(parents=True, exist_ok=True)
    nt_record = RECORDS / "nt_own.json"

    if args.nt:
        oracle = Path(os.environ.get("SMNNGP_ORACLE_VENV", ROOT / ".venv-oracle"))
        python = oracle / "bin" / "python"
        if not python.is_file():
            raise SystemExit(f"no oracle environment at {oracle}: run `bash scripts/make_golden.sh` first")
        nt_res = side(str(python), src, files, "nt", shim=False, workers=args.workers, extra=extra)
        if not partial:
            nt_record.write_text(json.dumps(nt_res, indent=1) + "\n")
    elif nt_record.is_file():
        nt_res = json.loads(nt_record.read_text())
    else:
        nt_res = {"files": {}}

    if args.no_ours:
        ours = {"files": {}}
    else:
        ours = side(sys.executable, src, files, "ours", shim=True, workers=args.workers, extra=extra)
    rows = exceptions()
    unexplained = []
    listed = []
    for f in files:
        for fail in ours["files"].get(f, {}).get("failed", []):
            reason = next((r for pat, r in rows if fnmatch.fnmatchcase(fail["id"], pat)), None)
            (listed if reason else unexplained).append((fail, reason))
    if not args.no_ours and not partial:
        ours["listed"] = [{"id": f["id"], "reason": r} for f, r in listed]
        ours["unexplained"] = [f for f, _ in unexplained]
        (RECORDS / "smnngp.json").write_text(json.dumps(ours, indent=1) + "\n")

    print(f"\n{'nt test file':34s} {'nt 0.6.5 (jax 0.4.23)':>26s}   {'smnngp.nt (jax ' + _jax_version() + ')':>34s}")
    print(f"{'':34s} {'pass':>8s} {'skip':>8s} {'fail':>8s}   {'pass':>8s} {'skip':>8s} {'listed':>8s} {'unexpl.':>8s}")
    for f in files:
        n = nt_res["files"].get(f)
        o = ours["files"].get(f)
        ncol = (f"{n['passed']:8d} {n['skipped']:8d} {len(n['failed']):8d}" if n else f"{'-':>8s} " * 3)
        if o:
            ids = {x["id"] for x in o["failed"]}
            n_listed = sum(1 for x, _ in listed if x["id"] in ids)
            ocol = f"{o['passed']:8d} {o['skipped']:8d} {n_listed:8d} {len(ids) - n_listed:8d}"
        else:
            ocol = f"{'-':>8s} " * 4
        print(f"{f:34s} {ncol}   {ocol}")
    if unexplained:
        print(f"\n{len(unexplained)} unexplained failure(s):")
        for fail, _ in unexplained:
            print(f"  {fail['id']}\n      {fail['message'][:200]}")
    print(f"\n{len(listed)} listed failure(s) (docs/neural-tangents.md, '{EXCEPTIONS_HEADING[3:]}')")
    return 1 if unexplained else 0


def _jax_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("jax")


if __name__ == "__main__":
    raise SystemExit(main())
