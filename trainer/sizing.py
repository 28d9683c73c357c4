"""The rules a plan follows, each stated with its source: the one dial of shapes, the loss a size is expected
to reach in the tokens a budget gives it, the learning rate that follows the width, and the batch.

No torch here: `tfkit recipes validate` checks a `model.size: auto` recipe against these rules in
milliseconds, and the tests check each rule's numbers exactly.

**Shapes: one dial.** nanochat's `--depth` sets everything from one number; here the dial is the width,
in steps that suit a CPU's small models as well as a GPU's (`WIDTHS`): depth = width / 64 (nanochat's aspect
ratio, at least MIN_LAYERS) and heads of 32 (below 256) or 64 dimensions. Each rung has 1.3-2x the parameters of
the one below, fine enough that half and twice the planned size lie a rung or two away.

**Which size: the predicted loss at the tokens that fit.** For each candidate the plan measures how many
tokens the budget trains (trainer/pace.py) and predicts the loss from a scaling law fitted on far larger
runs: L(N, D) = E + A / N^alpha + B / D^beta, with Besiroglu et al.'s (2024, "Chinchilla scaling: a replication
attempt") refit of Hoffmann et al.'s (2022) approach 3, N counting every parameter (embeddings included, as
Hoffmann et al. count them). The loss itself is not expected to match a tfkit run (another corpus, another
tokenizer); what the plan uses is where the law puts the optimum between a larger model and more tokens,
the compute-optimal token horizon at this machine's own cost of each size (not 6ND). A small corpus seen
many times is worth less than fresh text: data beyond one epoch counts as Muennighoff et al.'s (2023,
"Scaling data-constrained language models") effective data, repeated tokens decaying with R* = 15.4 epochs.
That law never counts repetition as harmful; on a small corpus tfkit's runs overfit: on stdlib:docs (436k
tokens) every size's validation loss stopped falling after 7-11 epochs and climbed after, so the planned size
trained 21 epochs and lost to twice its size, which trained 10, by 0.40 nats (benchmarks/RESULTS.md,
"Planning a run", 2026-11-28 18:03). Tokens past OVERFIT_EPOCHS epochs therefore count as none: a budget that
would repeat a small corpus further buys a larger model, not more epochs. Where validation bottoms out is not
one number (at the plan's smaller batches, after 6-8 epochs), so a planned run that repeats its corpus more than
KEEP_BEST_EPOCHS times keeps the weights of its lowest validation loss (`train.keep_best`), as nanoGPT keeps
only an improving checkpoint on its small corpora: Muennighoff et al. find up to 4 epochs of repeated data worth
about as much as fresh, and past them a run may start to overfit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Besiroglu et al. (2024), table 1: the refit of Chinchilla's approach 3 (loss in nats per token).
LAW_E, LAW_A, LAW_B, LAW_ALPHA, LAW_BETA = 1.82, 482.01, 2085.43, 0.3478, 0.3658
REPEAT_DECAY = 15.4  # Muennighoff et al. (2023), R*_D: epochs over which repeated data loses its worth
OVERFIT_EPOCHS = 10  # epochs of a corpus past which its tokens count as none (module doc: measured 7-11)
KEEP_BEST_EPOCHS = 4  # a planned run repeating its corpus more keeps its best validated weights (module doc)

# The dial: d_model in steps that grow by 1.2-1.33x, from a CPU's smallest useful model to GPT-2 XL's width.
WIDTHS = (32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 2048)
ASPECT = 64  # d_model per layer (nanochat: model_dim = depth * 64)
MIN_LAYERS = 2  # a 1-layer model cannot compose heads into induction heads (Olsson et al. 2022); d64 x 1
# trained worse than both d32 x 1 and d96 x 2 in the same CPU time (benchmarks/RESULTS.md, "Planning a run")


@dataclass(frozen=True)
class Shape:
    """A candidate's model keys."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None

    @classmethod
    def of(cls, d_model: int, n_layers: int | None = None, n_heads: int | None = None,
           n_kv_heads: int | None = None) -> Shape:
        """The dial's shape at width `d_model`, with any key given by hand kept."""
        layers = n_layers if n_layers is not None else max(MIN_LAYERS, round(d_model / ASPECT))
        heads = n_heads if n_heads is not None else max(1, d_model // (32 if d_model < 256 else 64))
        return cls(d_model, layers, heads, n_kv_heads)

    def keys(self) -> dict[str, int | None]:
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
                "n_kv_heads": self.n_kv_heads}

    def __str__(self) -> str:
        kv = "" if self.n_kv_heads in (None, self.n_heads) else f" ({self.n_kv_heads} kv)"
        return f"d_model {self.d_model}, {self.n_layers} layer{'s' * (self.n_layers != 1)}, {self.n_heads} heads{kv}"


def ladder(fixed: dict[str, int | None]) -> list[Shape]:
    """Every rung of the dial, smallest first, with the keys in `fixed` (d_model, n_layers, n_heads, n_kv_heads
    given by hand) kept as given; a given d_model leaves one rung."""
    widths = (fixed["d_model"],) if fixed.get("d_model") is not None else WIDTHS
    return [Shape.of(w, fixed.get("n_layers"), fixed.get("n_heads"), fixed.get("n_kv_heads")) for w in widths]


def effective_tokens(tokens: float, unique: float | None) -> float:
    """Tokens as fresh data is worth them: all of them within one epoch of `unique` tokens, then each repeat
    worth less (Muennighoff et al. 2023, eq. 5: U + U R* (1 - exp(-R / R*)), R the repeats), and none past
    OVERFIT_EPOCHS epochs (module doc)."""
    if unique is None or unique <= 0 or tokens <= unique:
        return tokens
    repeats = min(tokens / unique, OVERFIT_EPOCHS) - 1
    return unique + unique * REPEAT_DECAY * (1 - math.exp(-repeats / REPEAT_DECAY))


def predicted_loss(params: float, tokens: float, unique: float | None = None) -> float:
    """The law's loss of `params` parameters trained on `tokens` tokens of a corpus of `unique` (module doc)."""
    data = effective_tokens(max(tokens, 1.0), unique)
    return LAW_E + LAW_A / max(params, 1.0) ** LAW_ALPHA + LAW_B / data**LAW_BETA


# The learning rate follows the width (nanochat: AdamW's rates scaled by (d_model / 768) ** -0.5, from muP's
# 1/width for hidden matrices tempered for the embeddings and head, which dominate a small model): a recipe's
# optim.lr is read as the peak at LR_WIDTH, the width the bundled tiny recipes were tuned at.
LR_WIDTH = 128


def scaled_lr(lr: float, d_model: int) -> float:
    """optim.lr for a model of width `d_model`, from the recipe's rate at LR_WIDTH."""
    return lr * (d_model / LR_WIDTH) ** -0.5


MIN_UPDATES = 100  # fewer updates than this and warmup and decay are most of the run: a shape is not planned

# The batch. The law above counts tokens, not updates, and a short run is held back by its updates. On the
# quickstart's 5 minutes (benchmarks/RESULTS.md, "Quickstart", 2026-11-28), the planned d_model 96 trained on
# about 3M tokens either way, and scored 4.87 on the whole validation set after 1,635 updates of 16 sequences,
# 4.83 after 3,146 of 8 and 4.81 after 5,962 of 4 (one seed; three seeds at 4 spread 0.04): a small gain where
# the corpus is repeated seven times over. Earlier, at 80 s, a d_model 48 stayed on its unigram plateau (6.57)
# for 192 updates of 16 and reached 5.54 in 734 of 4.
# Early in training a small batch costs little per token (McCandlish et al. 2018: the critical batch grows
# as the loss falls), and on a CPU an update of 4 sequences is no slower per token than one of 16, so where
# the planned model fits fewer than TARGET_UPDATES updates, the plan halves the batch (trainer/plan.py), down
# to MIN_BATCH sequences, with the learning rate by the square root of the batch. A run long enough to fit
# them keeps the recipe's batch.
TARGET_UPDATES = 4000
MIN_BATCH = 4  # sequences: the smallest batch a plan halves a recipe's train.batch_size to
