"""One report writer for every experiment: results.json, results.md and figures in ``--out``."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import subprocess
from typing import Any


@dataclasses.dataclass
class Report:
    """What an experiment returns: machine-readable results plus a markdown body."""

    results: dict[str, Any]
    markdown: str
    figures: list[str] = dataclasses.field(default_factory=list)


def git_commit(cwd: str | None = None) -> str:
    """The current commit (with '+dirty' when the tree has uncommitted changes), or 'unknown'."""
    cwd = cwd or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as JSON to ``path`` atomically: a reader never sees half a file, and an interrupted run
    leaves the previous version in place. Arrays are written as lists; floats as they are (NaN stays ``NaN``,
    as `json` writes it: pass ``jsonable(obj)`` for ``null`` instead)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, default=_as_list)
    os.replace(tmp, path)


def _as_list(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def cell(path: str, config: dict, compute, *, log=None) -> dict:
    """A resumable unit of an experiment: the result stored at ``path`` when it was computed with the same
    ``config``, else ``compute()`` (a dict), stored with its config before it is returned.

    A stored cell with a different config is recomputed and overwritten (``log`` is told why)."""
    config = jsonable(config)
    if os.path.exists(path):
        with open(path) as fh:
            saved = json.load(fh)
        if saved.get("config") == config:
            return saved["result"]
        if log is not None:
            log(f"{path}: settings changed, recomputing")
    result = jsonable(compute())
    write_json_atomic(path, {"config": config, "result": result})
    return result


def write(out_dir: str, name: str, config: dict, seed: int, wall_time_s: float, report: Report) -> str:
    """Write results.json and results.md into ``out_dir``; return the markdown path."""
    import jax

    os.makedirs(out_dir, exist_ok=True)
    meta = {
        "experiment": name,
        "git_commit": git_commit(),
        "config": config,
        "seed": seed,
        "wall_time_s": round(wall_time_s, 3),
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "python": platform.python_version(),
        "figures": report.figures,
    }
    payload = {**meta, "results": jsonable(report.results)}
    tmp = os.path.join(out_dir, "results.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=2)
    os.replace(tmp, os.path.join(out_dir, "results.json"))
    md_path = os.path.join(out_dir, "results.md")
    header = (f"# {name}\n\ncommit `{meta['git_commit']}`, seed {seed}, wall time {wall_time_s:.1f} s, "
              f"jax {meta['jax']} on {meta['devices'][0]}\n\n")
    with open(md_path, "w") as fh:
        fh.write(header + report.markdown.rstrip() + "\n")
    return md_path


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; floats are printed with 4 significant digits."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
