"""A running lab says where it is: each training as it runs (training i of n, its step) with the time the lab's
trainings have left from the pace of the runs so far, as plain lines off a terminal and a bar on one. Every
time here comes from a fake clock; the steps from metrics.jsonl rows the test writes, as the trainer would."""

import contextlib
import io
import json
import threading

import pytest
from typer.testing import CliRunner

from tfkit.lab import engine, progress as lab_progress
from tfkit.lab.progress import PLAIN_EVERY, LabProgress, Training, duration, time_left
from helpers import Clock


def log_step(run_dir, step: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "loss": 5.0}) + "\n")


def at(seconds: float, run_dir, step: int, clock, progress) -> None:
    """At `seconds` on the clock, the training in `run_dir` has logged `step`, and the progress looks."""
    clock.now = seconds
    log_step(run_dir, step)
    progress.poll()


def three(tmp_path) -> list[Training]:
    return [Training("a/seed-1", "train", 1, 100, tmp_path / "a"),
            Training("b/seed-1", "train", 2, 100, tmp_path / "b"),
            Training("a+cls/seed-1", "finetune", 3, 50, tmp_path / "a+cls")]


def plain(tmp_path, clock, **kwargs) -> tuple[LabProgress, io.StringIO]:
    out = io.StringIO()
    return LabProgress(6, three(tmp_path), clock=clock, stream=out, terminal=False, **kwargs), out


def lines(out: io.StringIO) -> list[str]:
    text = out.getvalue().splitlines()
    out.seek(0)
    out.truncate()
    return text


def test_each_training_has_a_line_as_it_runs_with_an_estimate_from_the_pace_so_far(tmp_path):
    clock = Clock()
    progress, out = plain(tmp_path, clock)
    progress.begin("a/seed-1")
    assert lines(out) == ["lab: training 1/3 train a/seed-1: started, 100 steps; 3 trainings left, time unknown "
                          "until a pace is measured"]
    at(5.0, tmp_path / "a", 10, clock, progress)  # setup and the first steps: the pace is measured from here
    at(20.0, tmp_path / "a", 25, clock, progress)
    assert lines(out) == []  # off a terminal a running training's line comes every PLAIN_EVERY seconds
    at(PLAIN_EVERY + 5.0, tmp_path / "a", 40, clock, progress)
    # its own pace, 1 s a step since step 10: 60 s for its 60 steps, 100 s for b (the same group); the
    # fine-tuning has no pace to go by yet
    assert lines(out) == ["lab: training 1/3 train a/seed-1: step 40/100; 3 trainings left, about 2.7 min and 1 not "
                          "yet timed (fine-tuning)"]
    progress.finish("a/seed-1", 110.0)
    assert lines(out) == ["[  1/6] train a/seed-1: 110.0 s (1.10 s a step); 2 trainings left, about 1.8 min and 1 "
                          "not yet timed (fine-tuning)"]  # b: 100 steps at the whole run's 1.1 s a step
    progress.begin("b/seed-1")
    progress.finish("b/seed-1", 90.0)
    progress.begin("a+cls/seed-1")
    assert lines(out)[-1] == ("lab: training 3/3 finetune a+cls/seed-1: started, 50 steps; 1 training left, time "
                              "unknown until a pace is measured")
    at(100.0, tmp_path / "a+cls", 10, clock, progress)
    at(140.0, tmp_path / "a+cls", 30, clock, progress)
    assert lines(out) == ["lab: training 3/3 finetune a+cls/seed-1: step 10/50; 1 training left, time unknown until "
                          "a pace is measured",  # its first step seen: no pace yet, and none of its group's
                          "lab: training 3/3 finetune a+cls/seed-1: step 30/50; 1 training left, about 40 s"]
    progress.finish("a+cls/seed-1", 100.0)
    assert lines(out) == ["[  3/6] finetune a+cls/seed-1: 100.0 s (2.00 s a step); no training left"]


def test_other_units_of_work_keep_their_one_line(tmp_path):
    clock = Clock()
    progress, out = plain(tmp_path, clock)
    progress.step("convert kv2/seed-1", None)
    clock.now = 2.5
    progress.step("score a/seed-1", 0.5)
    assert lines(out) == ["[  1/6] convert kv2/seed-1: done before", "[  2/6] score a/seed-1: 2.0 s"]


def test_a_continued_training_counts_only_the_steps_it_trains(tmp_path):
    clock = Clock()
    progress, out = plain(tmp_path, clock)
    log_step(tmp_path / "a", 60)  # an interrupted run, continued from its checkpoint
    progress.begin("a/seed-1")
    assert lines(out)[0].startswith("lab: training 1/3 train a/seed-1: started at step 60 of 100;")
    progress.finish("a/seed-1", 20.0)
    assert "(0.50 s a step); 2 trainings left, about 50 s and 1 not yet timed" in lines(out)[0]


def test_concurrent_trainings_share_the_time_left(tmp_path):
    runs = three(tmp_path)[:2]
    for run in runs:
        run.step, run.began = 50, 0.0
    finished = {"training": [(200.0, 100)]}  # a run of as many steps took 200 s; these have run 100 s each
    alone, _ = time_left(runs, [], finished, 1, now=100.0)
    together, unknown = time_left(runs, [], finished, 2, now=100.0)
    assert (alone, together, unknown) == (200.0, 100.0, [])


def test_a_short_run_is_estimated_from_runs_as_short_not_from_a_pace_per_step(tmp_path):
    """In a short run setup and validation outweigh the steps: a 1-step uptraining after 8-step trainings is
    estimated from the 1-step runs once there is one."""
    up = Training("a+up/seed-1", "uptrain", 1, 1, tmp_path / "up")
    assert time_left([], [up], {"training": [(8.0, 8)]}, 1, now=0.0) == (1.0, [])  # 1 s a step
    assert time_left([], [up], {"training": [(8.0, 8), (3.0, 1)]}, 1, now=0.0) == (3.0, [])


@pytest.mark.parametrize("seconds, words", [(0.4, "under 1 s"), (4, "4 s"), (89, "89 s"), (90, "1.5 min"), (3600, "60.0 min"),
                                            (5400, "1.5 h")])
def test_durations_read_as_a_person_says_them(seconds, words):
    assert duration(seconds) == words


def test_lines_reach_the_console_while_a_training_writes_to_its_log(tmp_path, capsys):
    progress = LabProgress(2, three(tmp_path)[:1], clock=Clock(), terminal=False)  # the console of its creation
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # as engine.train_job sends the trainer's output to logs/NAME.log
        progress.begin("a/seed-1")
    assert log.getvalue() == ""
    assert capsys.readouterr().out.startswith("lab: training 1/1 train a/seed-1: started")


def test_on_a_terminal_each_training_is_a_bar_with_the_time_left(tmp_path, monkeypatch):
    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.n, self.postfix, self.closed = kwargs, kwargs.get("initial", 0), "", False
            bars.append(self)

        def update(self, n):
            self.n += n

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

        def close(self):
            self.closed = True

    monkeypatch.setattr(lab_progress, "progress_bar", lambda **kwargs: Bar(**kwargs))
    clock, out = Clock(), io.StringIO()
    progress = LabProgress(6, three(tmp_path), clock=clock, stream=out, terminal=True)
    progress.begin("a/seed-1")
    training = bars[-1]
    assert training.kwargs["desc"] == "training 1/3 train a/seed-1" and training.kwargs["total"] == 100
    at(1.0, tmp_path / "a", 10, clock, progress)
    at(3.0, tmp_path / "a", 12, clock, progress)
    assert training.n == 12 and training.postfix == "3 trainings left, about 3.1 min and 1 not yet timed (fine-tuning)"
    assert out.getvalue() == ""  # no plain lines on a terminal: the bar is redrawn in place
    progress.finish("a/seed-1", 100.0)
    assert training.closed and "[  1/6] train a/seed-1: 100.0 s" in out.getvalue()


def test_the_watcher_polls_until_its_block_ends(tmp_path, monkeypatch):
    progress, _ = plain(tmp_path, Clock())
    polled = threading.Event()
    monkeypatch.setattr(progress, "poll", polled.set)
    with progress.watch(every=0.001):
        assert polled.wait(timeout=60)  # a thread of its own polls while the block (a training) runs


SPEC = """\
base: gpt-tiny
reference: a
variants: {a: [], b: [model.n_layers=2]}
"""


def test_a_lab_run_says_each_training_and_estimates_from_the_first(tmp_path, english_text, monkeypatch):
    """The engine's own lines on a fake clock: every training takes 10 s on it, so after the first (8 --quick
    steps) the second is estimated at 10 s."""
    from tfkit.lab.plan import LabOptions
    from tfkit.lab.spec import load_spec

    (tmp_path / "train.txt").write_text(english_text[:60_000])
    (tmp_path / "valid.txt").write_text(english_text[60_000:70_000])
    (tmp_path / "spec.yaml").write_text(SPEC)
    options = LabOptions(seeds=1, quick=True, data=str(tmp_path / "train.txt"), evals=[str(tmp_path / "valid.txt")],
                         sets=[f"data.valid={tmp_path / 'valid.txt'}"])
    lab = engine.prepare(load_spec(str(tmp_path / "spec.yaml")), options, tmp_path / "out")
    clock, out, real = Clock(), io.StringIO(), engine.train_job

    def train_job(recipe, run_dir, log):
        interrupted, _ = real(recipe, run_dir, log)
        clock.now += 10.0
        return interrupted, 10.0

    monkeypatch.setattr(engine, "train_job", train_job)
    progress = LabProgress(4, engine.trainings(lab), clock=clock, stream=out, terminal=False)
    engine.run(lab, progress)
    said = [line for line in out.getvalue().splitlines() if "train" in line]
    assert said == ["lab: training 1/2 train a/seed-1337: started, 8 steps; 2 trainings left, time unknown until a "
                    "pace is measured",
                    "[  1/4] train a/seed-1337: 10.0 s (1.25 s a step); 1 training left, about 10 s",
                    "lab: training 2/2 train b/seed-1337: started, 8 steps; 1 training left, about 10 s",
                    "[  2/4] train b/seed-1337: 10.0 s (1.25 s a step); no training left"]
    assert engine.trainings(lab) == []  # continued, the lab has no training left


def test_quick_says_what_it_costs():
    from tfkit.cli.main import app

    result = CliRunner().invoke(app, ["lab", "run", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "in seconds" not in text and "minutes" in text
