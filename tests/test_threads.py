"""CPU threads: torch gets the cores that the machine's load leaves free, unless the user chose."""

import torch

from tfkit import threads


def test_auto_leaves_the_busy_cores_to_the_processes_using_them(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert threads.auto_threads() == 2
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.2, 2.0, 2.0))  # two busy processes
    assert threads.auto_threads() == 1
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    assert threads.auto_threads() == 1


def test_set_threads_applies_auto_a_number_or_the_users_omp_setting(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(threads, "auto_threads", lambda: 2)
        assert threads.set_threads("auto") == 2 and torch.get_num_threads() == 2
        assert threads.set_threads(1) == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert threads.set_threads("auto") == 1  # kept: the user's choice, not recomputed
    finally:
        torch.set_num_threads(before)
