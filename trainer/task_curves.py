"""The right-hand panel of loss.png when a run scores downstream tasks (trainer/downstream.py): the
validation loss and every task's accuracy against the tokens trained on, so a loss that falls while a task
score stalls (or the reverse) is seen at a glance."""

from __future__ import annotations

from .task_names import PREFIX

SCORES = ("/acc", "/acc_norm")  # the accuracies drawn (a cloze task's perplexity has another scale)


def token_curves(rows: list[dict]) -> tuple[list[tuple[int, float]], dict[str, list[tuple[int, float]]]]:
    """(validation loss, {task/NAME/METRIC: points}) against tokens; a validation row's tokens are those of
    the training row of its step when it carries none (a validation without task scores)."""
    tokens = {r["step"]: r["tokens"] for r in rows if isinstance(r.get("tokens"), int) and "step" in r}
    tokens.setdefault(0, 0)
    loss, tasks = [], {}
    for r in rows:
        if "val_loss" not in r or r.get("step") not in tokens:
            continue
        x = tokens[r["step"]]
        if isinstance(r["val_loss"], (int, float)):
            loss.append((x, r["val_loss"]))
        for key, value in r.items():
            if key.startswith(PREFIX) and key.endswith(SCORES) and isinstance(value, (int, float)):
                tasks.setdefault(key, []).append((x, value))
    return loss, tasks


def draw_task_panel(ax, loss: list[tuple[int, float]], tasks: dict[str, list[tuple[int, float]]]) -> None:
    """Validation loss (left axis) and task accuracies (right axis, 0..1) against tokens, on `ax`."""
    if loss:
        ax.plot(*zip(*loss), "o-", color="black", label="validation loss", linewidth=1.5, markersize=3)
    ax.set_xlabel("tokens trained on")
    ax.set_ylabel("validation loss (nats / token)")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    for key, points in tasks.items():
        right.plot(*zip(*points), "s--", label=key.removeprefix(PREFIX), linewidth=1.2, markersize=3)
    right.set_ylabel("task score")
    right.set_ylim(0.0, 1.0)
    lines = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
    ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize=7, loc="upper right")
