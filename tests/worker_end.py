"""How a pytest-xdist worker ends (the default run is `pytest -n 2`), loaded by conftest.py.

When the controller has a worker's results it terminates the worker's gateway, and execnet gives what the
worker still executes 5 seconds before it sends the worker a SIGINT. What a worker still executes then is
pytest's end-of-session garbage collection (a full collection, twice, to report unraisable exceptions).
After a whole suite's imports, models and compiled graphs the heap is large, and on a loaded 2-core
machine the collections outlast the 5 seconds: the SIGINT lands in a finalizer the collection runs, and
"Exception ignored in ... KeyboardInterrupt" with its traceback is printed on the run's stderr.

So a worker collects before it reports (session fixtures are torn down by then), freezes what survives (the
later collections scan nothing old, and take milliseconds), and from then on ignores SIGINT: it has nothing
left to interrupt, and execnet still ends a worker that hangs (os._exit, 10 seconds later).
"""

import gc
import signal

import pytest


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown, before xdist reports the worker finished
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, or a run without -n
        return
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
