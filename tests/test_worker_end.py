"""The default run's workers end quietly (tests/worker_end.py): a SIGINT that reaches a worker during its
end-of-session garbage collection, as execnet sends one to a worker whose end outlasts 5 seconds on a
loaded machine, prints no KeyboardInterrupt traceback on the run's stderr."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

INTERRUPTED_END = '''
import gc, os, signal, time

import pytest


class FreedLate:
    """A cycle with a finalizer: the garbage a worker's last collection frees. The first one freed gets the
    SIGINT execnet sends a worker still busy 5 seconds after it was told to end."""

    signalled = False

    def __init__(self):
        self.cycle = self

    def __del__(self):
        if not FreedLate.signalled:
            FreedLate.signalled = True
            os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler, if any, runs here: inside the finalizer


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        for _ in range(5):
            FreedLate()
        gc.collect()
'''


def test_a_sigint_during_a_worker_s_last_collection_prints_no_traceback(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "interrupted_end.py").write_text(INTERRUPTED_END)
    path = os.pathsep.join([str(tmp_path), str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # only the plugins named
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist", "-n", "1",
                           "-p", "worker_end", "-p", "interrupted_end", "-c", os.devnull, "--rootdir", str(tmp_path),
                           "test_one.py"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    assert "KeyboardInterrupt" not in done.stderr and "Traceback" not in done.stderr, done.stderr
