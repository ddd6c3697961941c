"""The one helper the experiment tests share: run ``python -m experiments ...`` from the repository root."""

import os
import signal
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_experiment(*args, timeout=450, retries=1, module="experiments") -> subprocess.CompletedProcess:
    """``python -m experiments *args`` in a subprocess (matplotlib headless); returns the finished process.
    ``module`` runs another entry point the same way (``tests._testdata``: the command line on stand-in data).

    The child runs with Python's fault handler on and its stdin closed (an xdist worker's stdin is its channel to
    the controller). If it runs past ``timeout`` seconds (the quick modes take well under a minute alone, up to
    about 150 s beside the rest of the suite) it is sent SIGABRT, on which the fault handler writes the stack of
    every thread to stderr, and it is started again, up to ``retries`` times, with a warning that carries those
    stacks; past that, `TimeoutError` with the stacks. Why: twice, in full runs of the suite (CI's and one here, at
    the same test, lowrank-pm25 --quick), a child stopped making progress for 900 s, while some thirty runs of the
    same command alone, beside a loaded core, and replaying the same worker's test sequence took about 20 s each;
    the stacks say where the next one stops."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONFAULTHANDLER="1")
    command = f"python -m {module} {' '.join(args)}"
    attempt = 0
    while True:
        with subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
                return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                try:
                    out, err = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
        attempt += 1
        message = (f"`{command}` ran past {timeout} s (attempt {attempt} of {retries + 1}); the stacks of its "
                   f"threads when it was stopped:\n{err.split('Extension modules:')[0][-12000:]}")
        if attempt > retries:
            raise TimeoutError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
