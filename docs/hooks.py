"""MkDocs hooks: the parts of the site that come from the repository as it is at build time.

Registered in ``mkdocs.yml`` (``hooks: [docs/hooks.py]``). What they do, in build order:

* ``on_config``: prepare the notebook kernel (a kernelspec ``smnngp-docs`` that runs this very interpreter, so the
  tutorials execute against the checkout being documented, whatever other ``python3`` kernels are installed), put the
  repository root on ``PYTHONPATH`` and switch tqdm's progress bars off; the kernels draw with matplotlib's inline
  backend (figures become outputs of the pages, whatever ``MPLBACKEND`` says), the example with Agg. Then
  start, in the background, the landing page's example (``docs/examples/student_t_outlier.py``, a subprocess) and
  the execution of every notebook in ``notebooks/`` (nbclient, ``$SMNNGP_DOCS_JOBS`` kernels at a time, default:
  the number of CPUs, each in a scratch working directory), so that they run while MkDocs renders the other pages.
  ``SMNNGP_DOCS_EXECUTE=0`` skips the execution, for a quick preview of the prose while editing
  (``SMNNGP_DOCS_EXECUTE=0 mkdocs serve --no-strict``); it logs a warning, so that a strict build refuses it.
* ``on_files``: add the executed notebooks as pages ``tutorials/<name>.ipynb`` (mkdocs-jupyter renders them; this
  runs before its own ``on_files``), the example's figure as ``assets/examples/<name>.png``, and every image that
  ``RESULTS.md`` shows under the path it uses, so that ``docs/results.md`` (which includes ``RESULTS.md``) has working
  images in strict mode.
* ``on_pre_page``: before a tutorial page is rendered, wait for its notebook. A cell that raises (or runs past
  ``$SMNNGP_DOCS_CELL_TIMEOUT`` seconds, default 1800) fails the build with the cell's traceback.
* ``on_page_markdown``: replace the marker ``<!-- README commands -->`` of the landing page by the first two
  ``bash`` blocks of ``README.md``, so the page always shows the README's commands verbatim.
* ``on_page_content`` / ``on_post_page``: index the objects the API pages document, then turn the docstrings'
  Sphinx roles (``:func:`name` ``, which mkdocstrings would print as text) into links to them.
* ``on_env``: wait for the example; a failing example fails the build with its error output.

Why the hook executes the notebooks rather than mkdocs-jupyter's ``execute: true``: mkdocs-jupyter runs them one
after another while it renders, and the six tutorials dominate the build; running them side by side from the start
of the build is about 1.6 times faster on two cores (fast mode, on the same loaded machine: 434 s one after another,
275 s two at a time). mkdocs-jupyter then renders the executed copies (``execute: false``), exactly as it would
have rendered its own.

Docstring warnings. griffe's warnings about docstrings fail the strict build. ``KNOWN_DOCSTRING_PROBLEMS`` is
empty now, so any docstring warning fails it; the mechanism remains for emergencies: a warning listed there (as
"path: message", without the line number) is downgraded to INFO (with a pointer here) until its docstring is
fixed, and an entry that no longer occurs is reported at the end of the build. A common cause: an Args entry that
documents several parameters at once (``x, y: ...``), which Google style (one name per entry) does not have;
griffe files it under a parameter named ``x, y`` that is not in the signature.

Nothing is written into the repository: generated files (executed notebooks, the figure) live in a temporary
directory until MkDocs copies them into the site; ``notebooks/`` stays output-free.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority, get_plugin_logger
from mkdocs.structure.files import File

log = get_plugin_logger("smnngp-docs")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "RESULTS.md"
README = ROOT / "README.md"
EXAMPLES = {"student_t_outlier": ROOT / "docs" / "examples" / "student_t_outlier.py"}
EXAMPLE_TIMEOUT_S = 300
KERNEL_NAME = "smnngp-docs"
README_MARKER = "<!-- README commands -->"

# griffe's docstring warnings that are known and downgraded to INFO: "path: message", without the line number.
# Empty: every docstring warning fails the strict build. Add an entry only in an emergency, and remove it once its
# docstring is fixed (the build reports entries that no longer occur).
KNOWN_DOCSTRING_PROBLEMS: frozenset[str] = frozenset()


class _KnownDocstringProblems(logging.Filter):
    """Downgrade the griffe warnings listed in KNOWN_DOCSTRING_PROBLEMS to INFO; count what it saw."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING:
            # the message reads "griffe: path.py:LINE: text" (mkdocstrings prefixes the logger's name)
            key = re.sub(r"^(?:griffe: )?(\S+?\.py):\d+: ", r"\1: ", record.getMessage())
            if key in KNOWN_DOCSTRING_PROBLEMS:
                self.seen.add(key)
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = f"known docstring problem (docs/hooks.py): {record.getMessage()}", ()
        return True


# mkdocstrings routes griffe's messages through this logger.
_GRIFFE_LOGGER = logging.getLogger("mkdocs.plugins.griffe")

# State of one build (``mkdocs serve`` runs the hooks again for every rebuild).
_state: dict = {"tmp": None, "examples": {}, "filter": None, "pool": None, "notebooks": {}, "clients": {},
                "objects": {}}


def _kill_kernels() -> None:
    """Kill the kernels still running (the build failed): their notebooks then end with DeadKernelError."""
    for client in list(_state["clients"].values()):
        process = getattr(getattr(getattr(client, "km", None), "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            process.kill()


def _cleanup() -> None:
    if _state["pool"] is not None:
        _state["pool"].shutdown(wait=True, cancel_futures=True)
        _state["pool"], _state["notebooks"], _state["clients"] = None, {}, {}
    if _state["filter"] is not None:
        _GRIFFE_LOGGER.removeFilter(_state["filter"])
        _state["filter"] = None
    for proc, _ in _state["examples"].values():
        if proc.poll() is None:
            proc.kill()
    _state["examples"] = {}
    if _state["tmp"] is not None:
        shutil.rmtree(_state["tmp"], ignore_errors=True)
        _state["tmp"] = None


def _write_kernelspec(where: Path) -> None:
    """A kernelspec named ``smnngp-docs`` launching ``sys.executable``; ``where`` goes first on JUPYTER_PATH."""
    spec_dir = where / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        # tqdm.auto warns on import that ipywidgets is missing; in a static page that is noise, not a result.
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.exec_lines=import warnings; warnings.filterwarnings('ignore', "
                 "message='IProgress not found')"],
        "display_name": f"smnngp docs ({sys.executable})",
        "language": "python",
        # Overrides an inherited MPLBACKEND (the test suite's Agg would leave the pages without figures).
        "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(where), os.environ.get("JUPYTER_PATH", "")) if p)


def _execute_notebook(src: Path, dest: Path, workdir: Path, cell_timeout: float) -> float:
    """Run ``src`` in a fresh ``smnngp-docs`` kernel (working directory ``workdir``), write it with outputs to
    ``dest``; return the wall time. Raises nbclient's CellExecutionError / CellTimeoutError / DeadKernelError."""
    import nbformat
    from nbclient import NotebookClient

    started = time.monotonic()
    nb = nbformat.read(src, as_version=4)
    workdir.mkdir(parents=True)
    client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=cell_timeout, allow_errors=False,
                            resources={"metadata": {"path": str(workdir)}})
    _state["clients"][src.name] = client
    client.execute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return time.monotonic() - started


def _copy_notebook(src: Path, dest: Path) -> float:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return 0.0


def on_config(config):
    _cleanup()
    _state["objects"] = {}
    tmp = Path(tempfile.mkdtemp(prefix="smnngp-docs-"))
    _state["tmp"] = tmp
    _write_kernelspec(tmp / "jupyter")
    _state["filter"] = _KnownDocstringProblems()
    _GRIFFE_LOGGER.addFilter(_state["filter"])
    # The notebook kernels and the example inherit this environment.
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would land in the pages as stderr fragments
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    fast = os.environ.get("SMNNGP_FAST") == "1"
    log.info("notebooks run in %s mode (SMNNGP_FAST=%s)", "fast" if fast else "full", os.environ.get("SMNNGP_FAST"))
    if not os.environ.get("SMNNGP_DATA_DIR"):
        log.info("SMNNGP_DATA_DIR is not set: notebooks that read data sets use the library's default location")
    jobs = int(os.environ.get("SMNNGP_DOCS_JOBS") or os.cpu_count() or 1)
    cell_timeout = float(os.environ.get("SMNNGP_DOCS_CELL_TIMEOUT") or 1800)
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not notebooks:
        raise PluginError(f"no notebooks found in {NOTEBOOKS}")
    execute = os.environ.get("SMNNGP_DOCS_EXECUTE", "1") != "0"
    _state["pool"] = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="notebook")
    if execute:
        log.info("executing %d notebooks, %d at a time", len(notebooks), jobs)
    else:
        log.warning("SMNNGP_DOCS_EXECUTE=0: the tutorials are rendered WITHOUT outputs (a preview of the prose only)")
    for nb in notebooks:
        dest = tmp / "pages" / "tutorials" / nb.name
        if execute:
            future = _state["pool"].submit(_execute_notebook, nb, dest, tmp / "workdirs" / nb.stem, cell_timeout)
        else:
            future = _state["pool"].submit(_copy_notebook, nb, dest)
        _state["notebooks"][nb.name] = future
    for name, script in EXAMPLES.items():
        out = tmp / "examples" / name
        out.mkdir(parents=True)
        log.info("running %s", script.relative_to(ROOT))
        proc = subprocess.Popen([sys.executable, str(script)], cwd=out, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
        _state["examples"][name] = (proc, time.monotonic())
    return config


@event_priority(100)  # before mkdocs-jupyter wraps the notebook files
def on_files(files, config):
    tmp = _state["tmp"]
    # A plain File under a scratch docs folder (not File.generated): mkdocs-jupyter's wrapper needs src_dir.
    for name in _state["notebooks"]:
        files.append(File(f"tutorials/{name}", src_dir=str(tmp / "pages"), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    for name in EXAMPLES:
        png = tmp / "examples" / name / f"{name}.png"
        files.append(File.generated(config, f"assets/examples/{name}.png", abs_src_path=str(png)))
    # Images shown by RESULTS.md, at the paths it names (relative to the repository root = the site root).
    for rel in sorted(set(re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", RESULTS.read_text(encoding="utf-8")))):
        src = ROOT / rel
        if "://" not in rel and src.is_file() and files.get_file_from_path(rel) is None:
            files.append(File.generated(config, rel, abs_src_path=str(src)))
    return files


def on_pre_page(page, config, files):
    src = page.file.src_uri
    name = src.removeprefix("tutorials/")
    if not src.startswith("tutorials/") or name not in _state["notebooks"]:
        return page
    log.info("waiting for notebooks/%s", name)
    mine = _state["notebooks"][name]
    # Wait for this notebook, but fail as soon as ANY notebook has failed rather than after the ones before it.
    while True:
        for other, future in _state["notebooks"].items():
            if future.done() and future.exception() is not None:
                # CellExecutionError carries the cell and its traceback
                raise PluginError(f"notebooks/{other} failed:\n{future.exception()}") from future.exception()
        if mine.done():
            break
        wait([f for f in _state["notebooks"].values() if not f.done()], return_when=FIRST_COMPLETED)
    log.info("notebooks/%s executed in %.1f s", name, mine.result())
    return page


def _readme_commands() -> str:
    blocks = re.findall(r"^```bash\n.*?^```$", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    if len(blocks) < 2:
        raise PluginError("README.md no longer starts with two ```bash blocks; update docs/index.md and docs/hooks.py")
    return "\n\n".join(blocks[:2])


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        if README_MARKER not in markdown:
            raise PluginError(f"docs/index.md lost its marker {README_MARKER!r}")
        markdown = markdown.replace(README_MARKER, _readme_commands())
    return markdown


_OBJECT_ID = re.compile(r'\bid="([A-Za-z_][\w.]*)"')
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):<code>~?([^<]+)</code>")


def on_page_content(html, page, config, files):
    # Collect the objects the API pages document (mkdocstrings gives every one an anchor id
    # "package.module.name"); all pages are converted before any is written, so on_post_page sees the whole index.
    if page.url.startswith("api/"):
        for object_id in _OBJECT_ID.findall(html):
            _state["objects"].setdefault(object_id, page.url)
    return html


def on_post_page(output, page, config):
    """Turn the docstrings' Sphinx roles (``:func:`name` ``), which mkdocstrings leaves as text, into links.

    A name resolves against the nearest documented object above it: ``fit`` inside ``finite.ard.fit_repeats``
    tries ``finite.ard.fit_repeats.fit``, then ``finite.ard.fit``, then ``finite.fit``, then ``fit``; a name that
    resolves nowhere keeps its code formatting without the role.
    """
    objects = _state["objects"]
    anchors = [(m.start(), m.group(1)) for m in _OBJECT_ID.finditer(output)]  # one pass; bisected per role
    starts = [pos for pos, _ in anchors]

    def link(match: re.Match) -> str:
        name = match.group(1).strip().removesuffix("()")
        i = bisect.bisect_left(starts, match.start())
        parts = anchors[i - 1][1].split(".") if i else []
        for k in range(len(parts), -1, -1):
            target = ".".join(parts[:k] + [name])
            if target in objects:
                href = posixpath.relpath(objects[target] or ".", page.url or ".")
                href = "" if href == "." else href.rstrip("/") + "/"
                return f'<a href="{href}#{target}"><code>{name}</code></a>'
        return f"<code>{name}</code>"

    return _ROLE.sub(link, output)


def on_env(env, config, files):
    # Static files (the figure among them) are copied right after this event.
    for name, (proc, started) in _state["examples"].items():
        try:
            output, _ = proc.communicate(timeout=max(1.0, EXAMPLE_TIMEOUT_S - (time.monotonic() - started)))
        except subprocess.TimeoutExpired as err:
            proc.kill()
            raise PluginError(f"docs example {name} did not finish in {EXAMPLE_TIMEOUT_S} s") from err
        png = _state["tmp"] / "examples" / name / f"{name}.png"
        if proc.returncode != 0 or not png.is_file():
            raise PluginError(f"docs example {name} failed (exit code {proc.returncode}):\n{output[-4000:]}")
        log.info("example %s done", name)
    return env


def on_post_build(config):
    seen = _state["filter"].seen if _state["filter"] is not None else set()
    if seen:
        log.info("%d known docstring problems downgraded (see docs/hooks.py)", len(seen))
    for gone in sorted(KNOWN_DOCSTRING_PROBLEMS - seen):
        log.info("known docstring problem no longer occurs, remove it from docs/hooks.py: %s", gone)
    _cleanup()


def on_build_error(error):
    _kill_kernels()
    _cleanup()
