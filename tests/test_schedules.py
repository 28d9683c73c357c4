"""Schedules are pure functions of the step: check exact values at the points that define them."""

import math

import pytest

from tfkit.trainer import schedules
from tfkit.trainer.recipe import ScheduleSection
from tfkit.trainer.schedules import lr_at


def test_warmup_reaches_peak_on_its_last_step_and_never_starts_at_zero():
    assert schedules.constant(0, peak=1.0, warmup=4) == 0.25
    assert schedules.constant(3, peak=1.0, warmup=4) == 1.0
    assert schedules.constant(100, peak=1.0, warmup=4) == 1.0
    assert schedules.constant(0, peak=2.0, warmup=0) == 2.0


def test_linear_decays_to_min_lr_at_max_steps():
    kw = dict(peak=1.0, warmup=10, max_steps=110, min_lr=0.0)
    assert schedules.linear(9, **kw) == 1.0
    assert schedules.linear(10, **kw) == 1.0
    assert schedules.linear(60, **kw) == pytest.approx(0.5, abs=1e-15)
    assert schedules.linear(110, **kw) == 0.0
    assert schedules.linear(500, **kw) == 0.0


def test_cosine_halfway_is_the_mean_of_peak_and_floor():
    kw = dict(peak=1e-3, warmup=100, max_steps=1100, min_lr=1e-4)
    assert schedules.cosine(99, **kw) == 1e-3
    assert schedules.cosine(100, **kw) == 1e-3
    assert schedules.cosine(600, **kw) == pytest.approx(5.5e-4, rel=1e-12)
    assert schedules.cosine(1100, **kw) == pytest.approx(1e-4, rel=1e-12)
    assert schedules.cosine(350, **kw) == pytest.approx(1e-4 + 0.45e-3 * (1 + math.cos(math.pi / 4)), rel=1e-12)


def test_noam_matches_the_paper_formula_and_peaks_at_warmup():
    d, warm = 512, 4000
    values = [schedules.noam(s, scale=1.0, warmup=warm, d_model=d) for s in range(8000)]
    assert values[0] == pytest.approx(d**-0.5 * 1 * warm**-1.5)
    assert max(range(8000), key=values.__getitem__) == warm - 1
    assert values[warm - 1] == pytest.approx(d**-0.5 * warm**-0.5)
    assert values[7999] == pytest.approx(d**-0.5 * 8000**-0.5)


def test_wsd_holds_then_decays_over_the_final_fraction():
    kw = dict(peak=1.0, warmup=10, max_steps=100, min_lr=0.1, decay_fraction=0.2)
    assert schedules.wsd(5, **kw) == pytest.approx(0.6)
    assert schedules.wsd(50, **kw) == 1.0
    assert schedules.wsd(79, **kw) == 1.0
    assert schedules.wsd(80, **kw) == 1.0
    assert schedules.wsd(90, **kw) == pytest.approx(0.55)
    assert schedules.wsd(100, **kw) == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["constant", "linear", "cosine", "noam", "wsd"])
def test_lr_at_dispatches_on_the_recipe_section(name):
    section = ScheduleSection(name=name, warmup_steps=10, min_lr=0.0)
    lrs = [lr_at(s, section, 1.0, 100, 64) for s in range(100)]
    assert all(v > 0 for v in lrs)
    assert lrs[0] < lrs[9]  # every schedule warms up
