"""`tfkit` for torchrun workers, steered by environment variables, for tests and benchmarks that kill, stop or
watch a distributed run at a step of its own progress (never at a moment of the clock):

- TFKIT_HOOK_IDS=PREFIX: every update's input ids, one JSON row per prepared batch, in PREFIX.rankN;
- TFKIT_HOOK_KILL=RANK:STEP: SIGKILL that worker as the window starting at STEP begins, on torchrun's first
  attempt only, or once across attempts when TFKIT_HOOK_KILL_MARK names a file to leave behind (restarted
  nodes may count their attempts differently);
- TFKIT_HOOK_STOP=STEP: every process sends itself SIGUSR1 so that the run stops at STEP (a preemption);
- TFKIT_HOOK_EXTRA=KEY=VALUE: rank 1 alone is given one more --set (a mismatched recipe).

    torchrun ... benchmarks/hooked_tfkit.py pretrain RECIPE ...
"""

import json
import os
import signal
import sys

from tfkit.trainer import data as data_module
from tfkit.trainer import loop as loop_module

env = os.environ.get
prepare = data_module.Prefetcher._prepare
window = loop_module.run_window


def recording(self, first):
    micro, counts = prepare(self, first)
    with open(env("TFKIT_HOOK_IDS") + f".rank{self.info.rank}", "a") as f:
        f.write(json.dumps({"first": first, "rows": [row for b in micro for row in b["input_ids"].tolist()]}) + "\n")
    return micro, counts


def due_to_die(rank: int, step: int) -> bool:
    """TFKIT_HOOK_KILL names this worker and step, on the first attempt or (with a mark) the first time."""
    if not env("TFKIT_HOOK_KILL") or [rank, step] != [int(v) for v in env("TFKIT_HOOK_KILL").split(":")]:
        return False
    mark = env("TFKIT_HOOK_KILL_MARK")
    if mark is None:
        return env("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if os.path.exists(mark):
        return False
    open(mark, "w").close()
    return True


def hooked(loop, *args):
    rank, step = loop.info.rank, loop.state.step
    if due_to_die(rank, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if env("TFKIT_HOOK_STOP") and step == int(env("TFKIT_HOOK_STOP")) - 1:  # SIGUSR1: stop after the next update
        os.kill(os.getpid(), signal.SIGUSR1)
    return window(loop, *args)


if __name__ == "__main__":
    if env("TFKIT_HOOK_IDS"):
        data_module.Prefetcher._prepare = recording
    loop_module.run_window = hooked
    sys.argv[0] = "tfkit"
    if env("TFKIT_HOOK_EXTRA") and env("RANK") == "1":
        sys.argv += ["--set", env("TFKIT_HOOK_EXTRA")]
    from tfkit.cli.entry import run

    run()
