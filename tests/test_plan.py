"""`tfkit plan` and `model.size: auto`: the shape, batch and learning rate chosen for a budget, from a fake pace
(a machine of a fixed speed, whatever this one's load), and the one-line refusals."""

import dataclasses
import json

import pytest
import yaml
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.errors import ConfigError
from tfkit.trainer import pace as pace_module
from tfkit.trainer.pace import Pace
from tfkit.trainer.budget import EVAL_COST
from tfkit.trainer.fits import parse_memory
from tfkit.trainer.pair_lengths import BYTES_PER_TOKEN
from tfkit.trainer.plan import MIN_UPDATES, STEPS_CAP, plan_recipe
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.resources import count_parameters
from tfkit.trainer.sizing import (KEEP_BEST_EPOCHS, LR_WIDTH, MIN_BATCH, OVERFIT_EPOCHS, TARGET_UPDATES, WIDTHS,
                                  Shape, ladder, predicted_loss, scaled_lr)

from helpers import fake_machine, one_error_line


class FakeMachine:
    """Seconds per update proportional to the update's work (6 N tokens), at `flops` per second; records
    every shape it was asked to time."""

    def __init__(self, flops: float = 3e10, share: float = 1.0):
        self.flops, self.share, self.timed = flops, share, []

    def __call__(self, recipe, cfg) -> Pace:
        self.timed.append(cfg.d_model)
        tokens = recipe.train.batch_size * recipe.data.seq_len
        seconds = 6 * count_parameters(cfg) * tokens / self.flops
        return Pace(seconds=seconds, wall=seconds / self.share, tokens=tokens)


def quickstart(*sets):
    return load_recipe("quickstart", ["model.size=auto", *sets])


def test_a_longer_budget_plans_a_larger_model_for_more_tokens():
    short = plan_recipe(quickstart(), budget=60, measure=FakeMachine())
    long = plan_recipe(quickstart(), budget=6000, measure=FakeMachine())
    assert long.chosen.params > short.chosen.params
    assert long.chosen.tokens > short.chosen.tokens
    for plan in (short, long):  # the chosen shape is the measured one of the lowest predicted loss
        assert plan.chosen.loss == min(c.loss for c in plan.candidates)


def test_the_law_counts_the_tokens_that_carry_a_loss():
    """An MLM learns from its chosen tokens only: at the same pace, a run that predicts a fifth of its inputs has
    a fifth of the data, and the plan picks a smaller model for more updates."""

    def predicting(share):
        machine = FakeMachine()

        def measure(recipe, cfg):
            pace = machine(recipe, cfg)
            return dataclasses.replace(pace, predicted=round(share * pace.tokens))
        return measure

    every = plan_recipe(quickstart(), budget=600, measure=predicting(1.0))
    fifth = plan_recipe(quickstart(), budget=600, measure=predicting(0.2))
    assert fifth.chosen.params < every.chosen.params and fifth.chosen.updates > every.chosen.updates
    assert every.chosen.shape == plan_recipe(quickstart(), budget=600, measure=FakeMachine()).chosen.shape


def test_a_small_corpus_buys_a_larger_model_not_more_epochs(tmp_path):
    """Past OVERFIT_EPOCHS epochs a corpus's tokens count as none: where a long budget would repeat a small corpus
    (24 epochs under the decay alone), the plan takes the size that trains about that many epochs and says so."""
    corpus = tmp_path / "small.txt"
    corpus.write_text("word " * 200_000)
    unique = corpus.stat().st_size / BYTES_PER_TOKEN
    plan = plan_recipe(quickstart(f"data.train={corpus}", "data.valid=null"), budget=3000, measure=FakeMachine())
    epochs = {c.shape.d_model: c.tokens / unique for c in plan.candidates}
    assert epochs[plan.shape.d_model] < 1.5 * OVERFIT_EPOCHS
    assert all(e > OVERFIT_EPOCHS for d, e in epochs.items() if d < plan.shape.d_model)
    assert f"{epochs[plan.shape.d_model]:.1f} epochs of data.train" in plan.text()
    fresh = plan_recipe(quickstart(), budget=3000, measure=FakeMachine())
    assert plan.chosen.params > fresh.chosen.params
    # where memory stops the walk below that rung, the run repeats the corpus further still
    held = plan_recipe(quickstart(f"data.train={corpus}", "data.valid=null"), budget=3000,
                       memory_limit=parse_memory("180MiB"), measure=FakeMachine())
    assert held.chosen.tokens / unique > 2 * OVERFIT_EPOCHS


def test_a_run_that_repeats_its_corpus_keeps_its_best_weights(tmp_path):
    """Past KEEP_BEST_EPOCHS epochs the planned run keeps the weights of its lowest validation loss, and says so;
    a run within them does not, and a train.keep_best given by --set wins."""
    corpus = tmp_path / "small.txt"
    corpus.write_text("word " * 200_000)
    unique = corpus.stat().st_size / BYTES_PER_TOKEN
    sets = (f"data.train={corpus}", "data.valid=null")
    long = plan_recipe(quickstart(*sets), budget=3000, measure=FakeMachine())
    assert long.chosen.tokens > KEEP_BEST_EPOCHS * unique and long.recipe.train.keep_best
    assert f"the run repeats data.train {long.chosen.tokens / unique:.0f} times" in long.text()
    assert "train.keep_best=true" in long.sets()
    short = plan_recipe(quickstart(*sets), budget=20, measure=FakeMachine())
    assert short.chosen.tokens < KEEP_BEST_EPOCHS * unique and not short.recipe.train.keep_best
    assert "repeats data.train" not in short.text() and "train.keep_best=false" in short.sets()
    given = plan_recipe(quickstart(*sets, "train.keep_best=false"), budget=3000, measure=FakeMachine())
    assert not given.recipe.train.keep_best and "repeats data.train" not in given.text()


def test_a_slower_machine_plans_a_smaller_model():
    fast = plan_recipe(quickstart(), budget=600, measure=FakeMachine(flops=3e11))
    slow = plan_recipe(quickstart(), budget=600, measure=FakeMachine(flops=3e9))
    assert slow.chosen.params < fast.chosen.params


def test_a_busy_cpu_counts_the_wall_time_the_run_will_see():
    """The pace is CPU time; a run on a CPU shared half with another job takes twice as long per update (at the
    batch given, which the plan keeps: else it may halve one plan's batch and not the other's)."""
    idle = plan_recipe(quickstart("train.batch_size=16"), budget=600, measure=FakeMachine(share=1.0))
    busy = plan_recipe(quickstart("train.batch_size=16"), budget=600, measure=FakeMachine(share=0.5))
    assert busy.share == pytest.approx(0.5)
    same = next(c for c in busy.candidates if c.shape == idle.chosen.shape)
    assert same.seconds == pytest.approx(2 * idle.chosen.seconds)


def test_the_validations_of_train_eval_every_are_counted_in_the_budget():
    """A run validates every train.eval_every updates besides the budget's spaced points; each validation reads
    eval.batches batches forward only (EVAL_COST of a training batch), so frequent ones leave fewer updates."""
    sparse = plan_recipe(quickstart("train.batch_size=16", "train.eval_every=100000"), budget=600, measure=FakeMachine())
    dense = plan_recipe(quickstart("train.batch_size=16", "train.eval_every=10"), budget=600, measure=FakeMachine())
    assert dense.shape == sparse.shape
    a, b = sparse.chosen, dense.chosen
    per_validation = 10 * EVAL_COST  # eval.batches (the quickstart's 10) batches of the training batch, forward only
    assert b.updates == pytest.approx(a.updates / (1 + per_validation / 10), abs=2)  # one per 10 updates
    assert b.updates < 0.8 * a.updates


def test_validations_are_counted_at_the_micro_batch_they_run_at():
    """Without eval.batch_size a run validates at its micro-batch: with train.grad_accum 2 of a batch of 16,
    eval.batches batches of 8 sequences, the same cost as eval.batch_size=8 given, and half that of 16."""
    sets = ("train.batch_size=16", "train.grad_accum=2", "train.eval_every=10")
    micro = plan_recipe(quickstart(*sets), budget=600, measure=FakeMachine())
    given = plan_recipe(quickstart(*sets, "eval.batch_size=8"), budget=600, measure=FakeMachine())
    whole = plan_recipe(quickstart(*sets, "eval.batch_size=16"), budget=600, measure=FakeMachine())
    assert micro.shape == given.shape == whole.shape and micro.chosen.grad_accum == 2
    assert micro.chosen.updates == given.chosen.updates
    v = 10 * EVAL_COST * 8 / 16  # a validation: eval.batches (10) batches of 8 rows, forward only, in updates of 16
    budget = micro.chosen.updates * (1 + v / 10) + 9 * v  # in updates: one validation per 10, and the budget's 9
    assert whole.chosen.updates == pytest.approx((budget - 9 * 2 * v) / (1 + 2 * v / 10), abs=2)  # each twice the rows


def test_the_walk_stops_two_rungs_past_the_best():
    machine = FakeMachine()
    plan = plan_recipe(quickstart("train.batch_size=16"), budget=600, measure=machine)  # one walk: batch given
    best = WIDTHS.index(plan.shape.d_model)
    assert machine.timed == list(WIDTHS[: best + 3])  # measured up to PATIENCE rungs past the best, no more


def test_the_resolved_recipe_is_what_pretrain_runs():
    plan = plan_recipe(quickstart(), budget=600, measure=FakeMachine())
    r = plan.recipe
    assert r.model.size is None and (r.model.d_model, r.model.n_layers, r.model.n_heads) == (
        plan.shape.d_model, plan.shape.n_layers, plan.shape.n_heads)
    batch = r.train.batch_size  # the width's rule, and the batch's where the plan halved it
    assert r.optim.lr == pytest.approx(3e-3 * (plan.shape.d_model / LR_WIDTH) ** -0.5 * (batch / 16) ** 0.5)
    assert r.planned == plan.chosen.updates and r.train.max_time == "5m"
    assert r.train.max_steps == STEPS_CAP * plan.chosen.updates  # a cap: train.max_time ends the run
    assert r.problems() == []
    again = load_recipe("quickstart", plan.sets())  # the printed --set items give the same recipe
    assert (again.model.d_model, again.optim.lr, again.train.max_steps) == (
        r.model.d_model, pytest.approx(r.optim.lr, rel=1e-3), r.train.max_steps)


def test_keys_given_by_hand_win():
    plan = plan_recipe(quickstart("model.n_layers=3"), budget=600, measure=FakeMachine())
    assert all(c.shape.n_layers == 3 for c in plan.candidates)
    fixed = plan_recipe(quickstart("model.d_model=96"), budget=600, measure=FakeMachine())
    assert [c.shape.d_model for c in fixed.candidates] == [96]
    capped = plan_recipe(quickstart("train.max_steps=120"), budget=6000, measure=FakeMachine())
    assert capped.recipe.train.max_steps == 120 and "train.max_steps=120 was given by hand and wins" in capped.text()


def test_the_micro_batch_is_the_largest_that_fits_memory():
    roomy = plan_recipe(quickstart(), budget=600, memory_limit=parse_memory("8GiB"), measure=FakeMachine())
    assert roomy.chosen.grad_accum == 1
    tight = plan_recipe(quickstart(), budget=600, memory_limit=parse_memory("170MiB"), measure=FakeMachine())
    assert tight.chosen.grad_accum > 1 and tight.chosen.memory.peak <= parse_memory("170MiB")
    assert tight.recipe.train.grad_accum == tight.chosen.grad_accum


def test_a_budget_too_small_for_any_shape_says_what_the_smallest_needs():
    with pytest.raises(ConfigError, match=rf"train.max_time: 1 s trains fewer than {MIN_UPDATES} updates of the "
                                          r"smallest model \(d_model 32, 2 layers.*it needs at least"):
        plan_recipe(quickstart(), budget=1, measure=FakeMachine(flops=1e9))


def test_a_small_budget_halves_the_batch_before_refusing():
    """At batch 16 even d_model 32 fits fewer than MIN_UPDATES updates in 5 s, at 8 too; at 4 it fits."""
    plan = plan_recipe(quickstart(), budget=5, measure=FakeMachine())
    assert plan.recipe.train.batch_size == 4 and plan.chosen.updates >= MIN_UPDATES
    assert "note: train.batch_size halved from 16 to 4" in plan.text()
    assert plan.recipe.optim.lr == pytest.approx(scaled_lr(3e-3, plan.shape.d_model) * 0.5)  # sqrt(4 / 16)
    with pytest.raises(ConfigError, match=r"fewer than 100 updates of the smallest model \(d_model 32, 2 layers, "
                                          r"1 heads, batch 16, "):
        plan_recipe(quickstart("train.batch_size=16"), budget=5, measure=FakeMachine())  # given: it wins
    with pytest.raises(ConfigError, match=r"batch 4, halved from train.batch_size=16, .* it needs at least"):
        plan_recipe(quickstart(), budget=1, measure=FakeMachine())


def test_a_short_run_trains_more_updates_of_a_smaller_batch():
    """A plan that fits fewer than TARGET_UPDATES updates halves the batch until it fits them (or reaches
    MIN_BATCH); a long budget keeps the recipe's batch, and a batch given by --set wins."""
    short = plan_recipe(quickstart(), budget=60, measure=FakeMachine())
    assert short.recipe.train.batch_size < 16 and "train.batch_size halved from 16 to" in short.text()
    assert short.chosen.updates >= TARGET_UPDATES or short.recipe.train.batch_size == MIN_BATCH
    at_16 = plan_recipe(quickstart("train.batch_size=16"), budget=60, measure=FakeMachine())
    assert at_16.recipe.train.batch_size == 16 and at_16.chosen.updates < TARGET_UPDATES
    assert short.chosen.updates > at_16.chosen.updates
    # on stdlib:code (3M tokens: no cap on epochs binds) 6000 s fit TARGET_UPDATES updates at the recipe's batch
    long = plan_recipe(quickstart("data.train=stdlib:code", "data.valid=null"), budget=6000, measure=FakeMachine())
    assert long.chosen.updates >= TARGET_UPDATES and long.recipe.train.batch_size == 16
    assert " epochs of data.train)" in long.text()  # the plan knows the built-in corpus's size


def test_a_halved_batch_still_validates_the_rows_of_the_recipes_batch():
    """The quickstart validates eval.batches (10) batches of 16 rows; a plan that halves its batch to 4 keeps
    those rows (eval.batch_size 16), counted at their cost: the plan is the one made with eval.batch_size=16 given."""
    halved = plan_recipe(quickstart("train.eval_every=50"), budget=60, measure=FakeMachine())
    given = plan_recipe(quickstart("train.eval_every=50", "eval.batch_size=16"), budget=60, measure=FakeMachine())
    assert halved.recipe.train.batch_size == 4 and halved.recipe.eval.batch_size == 16
    assert (halved.shape, halved.chosen.updates) == (given.shape, given.chosen.updates)
    assert "eval.batch_size=16" in halved.sets()
    assert plan_recipe(quickstart("eval.batch_size=8"), budget=60, measure=FakeMachine()).recipe.eval.batch_size == 8


def test_a_memory_limit_below_the_smallest_model_is_refused():
    with pytest.raises(ConfigError, match=r"memory: the smallest model the plan may choose, d_model 32, 2 layers.* "
                                          r"at micro-batch 1, needs .* above the limit of 10 MiB"):
        plan_recipe(quickstart(), budget=600, memory_limit=parse_memory("10MiB"), measure=FakeMachine())


def test_a_fixed_key_that_leaves_nothing_that_fits_says_the_given_key_wins():
    with pytest.raises(ConfigError, match=r"model.d_model=2048 given by hand: a given key wins over the plan"):
        plan_recipe(quickstart("model.d_model=2048"), budget=600, memory_limit=parse_memory("1GiB"),
                    measure=FakeMachine())


def test_auto_needs_a_budget_and_pretraining():
    with pytest.raises(ConfigError, match=r"model.size: auto plans the model for a time budget: give "
                                          r"train.max_time"):
        load_recipe("quickstart", ["model.size=auto", "train.max_time=null"])
    with pytest.raises(ConfigError, match=r"model.size: auto plans a model to pretrain"):
        load_recipe("quickstart", ["model.size=auto", "train.init_from=somewhere"])


@pytest.mark.parametrize("text,n", [("512MiB", 512 * 2**20), ("8GiB", 8 * 2**30), ("8G", 8 * 2**30),
                                    ("1.5gb", int(1.5 * 2**30))])
def test_memory_sizes(text, n):
    assert parse_memory(text) == n


def test_the_rules():
    assert [s.n_layers for s in ladder({})][:6] == [2] * 6 and ladder({})[-1] == Shape(2048, 32, 32)
    assert scaled_lr(1e-3, 4 * LR_WIDTH) == pytest.approx(5e-4)
    # the law: more tokens or more parameters lower the loss; repeated data is worth less than fresh
    assert predicted_loss(1e6, 2e7) < predicted_loss(1e6, 1e7) and predicted_loss(2e6, 1e7) < predicted_loss(1e6, 1e7)
    assert predicted_loss(1e6, 1e8, unique=1e6) > predicted_loss(1e6, 1e8)


def fake_pace(monkeypatch, flops=3e10):
    machine = FakeMachine(flops)
    monkeypatch.setattr(pace_module, "measure_pace", lambda recipe, cfg, device, **options: machine(recipe, cfg))
    return machine


def test_plan_command_prints_the_plan_and_writes_the_recipe(monkeypatch, tmp_path):
    fake_pace(monkeypatch)
    out = tmp_path / "planned.yaml"
    result = CliRunner().invoke(app, ["plan", "quickstart", "--time", "10m", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "plan for quickstart: 10 min of training on cpu" in result.output and "<- planned" in result.output
    for word in ("parameters", "tokens/s predicted", "predicted peak per device", "Besiroglu", "optim.lr"):
        assert word in result.output
    saved = yaml.safe_load(out.read_text())
    assert saved["model"]["size"] is None and saved["train"]["max_time"] == "10m"
    assert load_recipe(str(out)).model.d_model == saved["model"]["d_model"]


def test_the_command_to_run_the_plan_sets_each_key_once(monkeypatch):
    fake_pace(monkeypatch)
    result = CliRunner().invoke(app, ["plan", "quickstart", "--time", "10m", "--set", "train.seed=3"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("run it: tfkit pretrain quickstart"))
    keys = [item.split("=", 1)[0] for item in line.split("--set ")[1:]]
    assert len(keys) == len(set(keys)) and "train.seed" in keys and "train.max_time=10m" in line


@pytest.mark.parametrize("args,says", [
    (["--time", "1s"], "error: train.max_time: 1 s trains fewer than 100 updates of the smallest model"),
    (["--memory", "5MiB"], "error: --memory: the smallest model the plan may choose"),
    (["--memory", "lots"], "error: --memory: got 'lots', expected a size such as 512MiB or 8GiB"),
    (["--set", "model.d_model=4096", "--memory", "1GiB"], "model.d_model=4096 given by hand: a given key wins"),
])
def test_plan_command_refusals_are_one_line(monkeypatch, args, says):
    fake_pace(monkeypatch, flops=1e9)
    line = one_error_line(CliRunner().invoke(app, ["plan", "quickstart", *args]))
    assert says in line, line


def test_pretrain_with_size_auto_trains_the_planned_model(english_file, tmp_path, monkeypatch):
    fake_machine(monkeypatch)  # the run's budget on a fixed clock
    fake_pace(monkeypatch)
    run = tmp_path / "run"
    sets = [f"data.train={english_file}", "model.size=auto", "train.max_time=30s", "train.max_steps=12",
            "train.batch_size=4", "data.seq_len=32", "eval.batches=1", "tokenizer.vocab_size=400",
            "tokenizer.max_train_mb=0.1", "log.progress=false", "log.plot=false", "log.tensorboard=false",
            "eval.sample_prompt=null", "train.threads=1", "schedule.warmup_steps=2"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(run),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "plan for gpt-tiny" in result.output and "train.max_steps=12 was given by hand and wins" in result.output
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved["model"]["size"] is None and saved["train"]["max_steps"] == 12  # a resume repeats the plan
    config = json.loads(next((run / "checkpoints").iterdir()).joinpath("config.json").read_text())
    assert config["model"]["d_model"] == saved["model"]["d_model"]


def test_a_recipe_given_by_hand_that_would_not_fit_is_refused_with_what_would(monkeypatch, tmp_path):
    from tfkit.trainer import fits

    monkeypatch.setattr(fits, "default_memory_limit", lambda device: parse_memory("250MiB"))
    result = CliRunner().invoke(app, ["pretrain", "quickstart", "--run-dir", str(tmp_path / "run"),
                                      "--set", "model.size=tiny", "--set", "train.batch_size=64"])
    line = one_error_line(result)
    assert "model: this run's predicted peak memory is" in line and "at micro-batch 64, above the 250 MiB" in line
    assert "train.grad_accum=" in line and "fits (micro-batch" in line
    assert not (tmp_path / "run").exists()  # refused before anything was written
    monkeypatch.setattr(fits, "default_memory_limit", lambda device: parse_memory("150MiB"))
    line = one_error_line(CliRunner().invoke(app, ["pretrain", "quickstart", "--run-dir", str(tmp_path / "run"),
                                                   "--set", "model.size=tiny"]))
    assert "no micro-batch of this model fits: `tfkit plan RECIPE --time T` chooses a model that does" in line


@pytest.mark.parametrize("name", ["bert-tiny", "transformer-tiny", "llama-tiny"])
def test_every_family_is_planned(name):
    recipe = load_recipe(name, ["model.size=auto", "train.max_time=10m"])
    plan = plan_recipe(recipe, measure=FakeMachine())
    assert plan.recipe.model.arch == recipe.model.arch and plan.recipe.problems() == []
    assert plan.chosen.memory.activations > 0 and plan.chosen.updates >= MIN_UPDATES
