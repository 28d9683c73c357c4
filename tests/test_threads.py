"""CPU threads: torch gets the cores that the machine's load leaves free, unless the user chose."""

import torch

from tfkit import threads


def test_auto_counts_the_cores_idle_now_not_the_load_of_the_last_minute(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.0, 2.0, 2.0))  # a command that just finished

    def sampled(idle_share):
        readings = iter([(0, 0), (int(1000 * idle_share), 1000)])  # (idle, total) before and after
        monkeypatch.setattr(threads, "_cpu_times", lambda: next(readings))

    sampled(0.98)  # an idle machine: both cores, whatever the load average says
    assert threads.auto_threads() == 2
    sampled(0.03)  # two busy processes on two cores
    assert threads.auto_threads() == 1
    sampled(0.5)  # one busy process: one core left
    assert threads.auto_threads() == 1


def test_without_proc_stat_the_load_average_decides(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "_cpu_times", lambda: (_ for _ in ()).throw(OSError("no /proc")))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert threads.auto_threads() == 2
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.2, 2.0, 2.0))
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
