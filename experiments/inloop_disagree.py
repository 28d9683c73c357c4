"""When the validation loss and a downstream score disagree: two bert-tiny recipes, judged in the loop.

    python -m experiments.inloop_disagree [--out runs/inloop-disagree] [--quick]

Two pretrainings of bert-tiny on stdlib:docs:train, 600 MLM updates each, a validation every 50 with the
`stdlib:topics` linear probe (`eval.probe`) scored at each:
- `80/10/10`: BERT's masking (of the 15% chosen tokens, 80% become [MASK], 10% a random token, 10% stay);
- `keep-all`: `objective.mask_replace=[0, 0, 1]`: every chosen token stays as it was, so predicting it is
  copying the visible input (the BERT the lab saw learning to copy).
Each validates under its own masking, as a run does, so `keep-all`'s loss falls far below `80/10/10`'s: by
the loss it is the much better model. The probe reads both on the same labelled rows. Then each final
checkpoint is fine-tuned once by `finetune-classify` (stdlib:topics, 150 updates, mean pooling): does the
probe rank the two as a fine-tuning does? It writes the figure (validation loss and probe accuracy against
tokens, `--figure`, default docs/inloop-disagree.png) and prints the table benchmarks/RESULTS.md keeps.
Finished runs in `--out` are reused, so a second call only redraws. `--quick`: 4 updates of a tiny model,
a 2-update fine-tuning, the figure in the run folder; it checks the script runs and records nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

RECIPES = {"80/10/10": [], "keep-all": ["objective.mask_replace=[0.0, 0.0, 1.0]"]}
FULL = ["train.max_steps=600", "train.eval_every=50", "train.save_every=600", "eval.probe=stdlib:topics",
        "log.progress=false", "train.threads=1"]
QUICK = ["train.max_steps=4", "train.eval_every=2", "train.save_every=4", "eval.probe=stdlib:topics",
         "log.progress=false", "train.threads=1", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
         "train.batch_size=4", "data.seq_len=32", "eval.batches=1", "tokenizer.vocab_size=400",
         "tokenizer.max_train_mb=0.05", "log.plot=false", "log.tensorboard=false"]
PROBE = "task/probe-topics/acc"


def pretrained(name: str, sets: list[str], folder: Path) -> Path:
    """The run folder of one recipe, trained unless it already finished."""
    from tfkit.checkpoints.run_record import read_metrics
    from tfkit.evaluation.inloop import build_downstream
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.run import pretrain

    recipe = load_recipe("bert-tiny", sets + RECIPES[name])
    run_dir = folder / name.replace("/", "-")
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and any(r.get("step") == recipe.train.max_steps and PROBE in r for r in read_metrics(metrics)):
        return run_dir
    print(f"pretraining {name} in {run_dir} ...", file=sys.stderr, flush=True)
    with contextlib.redirect_stdout(io.StringIO()):
        pretrain(recipe, run_dir=run_dir, resume="auto", downstream=build_downstream(recipe))
    return run_dir


def fine_tuned(run_dir: Path, quick: bool) -> float:
    """The held-out accuracy of `finetune-classify` started from the run's last checkpoint (reused when done)."""
    from tfkit.checkpoints.run_record import read_metrics
    from tfkit.evaluation.metrics import task_scores
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.run import pretrain

    out = run_dir.parent / f"{run_dir.name}-finetuned"
    sets = [f"train.init_from={run_dir}", "log.progress=false", "train.threads=1"]
    sets += ["train.max_steps=2", "train.eval_every=2", "data.seq_len=32", "train.batch_size=4", "log.plot=false",
             "log.tensorboard=false"] if quick else []
    recipe = load_recipe("finetune-classify", sets)
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "val_accuracy" in r] if out.is_dir() else []
    if not rows or rows[-1]["step"] != recipe.train.max_steps:
        print(f"fine-tuning {run_dir.name} in {out} ...", file=sys.stderr, flush=True)
        with contextlib.redirect_stdout(io.StringIO()):
            pretrain(recipe, run_dir=out, resume="auto", scorer=task_scores)
        rows = [r for r in read_metrics(out / "metrics.jsonl") if "val_accuracy" in r]
    return rows[-1]["val_accuracy"]


def curves(run_dir: Path) -> tuple[list, list]:
    """(tokens, validation loss) and (tokens, probe accuracy) of one run."""
    from tfkit.checkpoints.run_record import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if PROBE in r]
    return [(r["tokens"], r["val_loss"]) for r in rows], [(r["tokens"], r[PROBE]) for r in rows]


def draw(results: dict, figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, probe_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        loss_ax.plot(*zip(*r["loss"]), "o-", markersize=3, label=name)
        probe_ax.plot(*zip(*r["probe"]), "s-", markersize=3, label=f"{name} (fine-tuned: {100 * r['finetuned']:.1f}%)")
    loss_ax.set(xlabel="tokens trained on", ylabel="validation loss (nats / masked token, own masking)",
                yscale="log", title="the loss: keep-all looks far better")
    probe_ax.set(xlabel="tokens trained on", ylabel="stdlib:topics probe accuracy (354 held out)",
                 title="the probe: 80/10/10 is better")
    for ax in (loss_ax, probe_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("bert-tiny, 600 MLM updates: validation loss and a downstream score disagree", fontsize=10)
    fig.tight_layout()
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figure, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.inloop_disagree", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/inloop-disagree"))
    parser.add_argument("--figure", type=Path, default=None, help="default docs/inloop-disagree.png")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds: checks the script runs")
    args = parser.parse_args(argv)
    figure = args.figure or (args.out / "inloop-disagree.png" if args.quick else Path("docs/inloop-disagree.png"))
    results = {}
    for name in RECIPES:
        run_dir = pretrained(name, QUICK if args.quick else FULL, args.out)
        loss, probe = curves(run_dir)
        results[name] = {"loss": loss, "probe": probe, "finetuned": fine_tuned(run_dir, args.quick)}
    draw(results, figure)
    print("| recipe | validation loss at the end | probe at step 0 | probe at its best (tokens) | probe at the end "
          "| fine-tuned accuracy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        best = max(r["probe"], key=lambda p: (p[1], -p[0]))
        print(f"| {name} | {r['loss'][-1][1]:.3f} | {100 * r['probe'][0][1]:.1f}% | {100 * best[1]:.1f}% "
              f"({best[0]:,}) | {100 * r['probe'][-1][1]:.1f}% | {100 * r['finetuned']:.1f}% |")
    print(json.dumps({name: {k: v for k, v in r.items()} for name, r in results.items()}), file=sys.stderr)
    print(f"figure: {figure}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
