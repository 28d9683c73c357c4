"""Resource sanity at recipe load: what the libraries accept and what this machine can hold.

A recipe whose model cannot fit in memory used to abort in the allocator (`model.d_model: 131072`) or
deep inside torch (`model.vocab_size: 3e9`), and a seed beyond 2**64 failed in `torch.manual_seed` with a
traceback. These checks run with the other recipe problems, before anything is written, and each is one
line naming the key, the estimate and the limit.

The parameter count is computed from the model keys (`count_parameters`), without building a model or
importing torch. Training in fp32 with AdamW holds 16 bytes per parameter (weights, gradients, two
moments), before activations.
"""

from __future__ import annotations


from ..runtime import machine_memory
from ..tokenization.train import MAX_VOCAB as MAX_TOKENIZER_VOCAB

MAX_SEED = 2**63 - 1  # torch.manual_seed takes < 2**64, numpy's SeedSequence a non-negative int: both hold
TRAIN_BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW's two moments


def count_parameters(cfg) -> int:
    """The parameters of the model `cfg` describes, counted from its keys (within a few per cent: norms and
    biases are counted as the common layouts have them). Counting needs no model and no torch, so
    `tfkit recipes validate` stays quick, and a recipe asking for a million layers is counted at once."""
    d, kv_width = cfg.d_model, cfg.kv_heads * cfg.head_dim
    attention = 2 * d * d + 2 * d * kv_width + (2 * d + 2 * kv_width if cfg.bias else 0)
    ffn = (3 if cfg.activation == "swiglu" else 2) * d * cfg.ffn_dim + ((cfg.ffn_dim + d) if cfg.bias else 0)
    norms = 2 * d * (2 if cfg.norm == "layernorm" else 1)
    block = attention + ffn + norms
    blocks = cfg.stored_layers * block  # one block per stack with model.share_layers
    if cfg.arch == "transformer":  # an encoder and a decoder of n_layers each; the decoder's cross-attention
        blocks += cfg.stored_layers * (block + attention + norms // 2)
    embeddings = cfg.vocab_size * d + (cfg.max_seq_len * d if cfg.positions == "learned" else 0)
    if cfg.arch == "bert":
        embeddings += cfg.type_vocab_size * d
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return blocks + embeddings + head


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def seed_problems(seed: int, key: str = "train.seed") -> list[str]:
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= MAX_SEED:
        return [f"{key}: got {seed}, expected 0 <= seed < 2**63 (what torch and numpy accept)"]
    return []


def vocab_problems(vocab_size: int, key: str = "tokenizer.vocab_size") -> list[str]:
    if isinstance(vocab_size, int) and vocab_size > MAX_TOKENIZER_VOCAB:
        return [f"{key}: got {vocab_size}, expected at most {MAX_TOKENIZER_VOCAB:,} (2**24; the tokenizers "
                "library aborts the process on vocabularies near 1e9)"]
    return []


def memory_problems(recipe, memory: int | None = None) -> list[str]:
    """The model of `recipe` (vocabulary from model.vocab_size, else tokenizer.vocab_size) against this
    machine's memory: one line with the parameter count, the estimate and the memory, or nothing."""
    vocab = recipe.model.vocab_size or recipe.tokenizer.vocab_size
    try:
        cfg = recipe.model.config(vocab)
        params = count_parameters(cfg)
    except Exception:  # noqa: BLE001 - an invalid model config is reported by its own problems
        return []
    need = params * TRAIN_BYTES_PER_PARAM
    have = machine_memory() if memory is None else memory
    if need <= have:
        return []
    return [f"model: {params:,} parameters (model.vocab_size={vocab}, model.d_model={cfg.d_model}, model.n_layers="
            f"{cfg.n_layers}, model.max_seq_len={cfg.max_seq_len}) need about {_gib(need)} to train (16 bytes per "
            f"parameter: fp32 weights, gradients, AdamW moments), more than this machine's {_gib(have)} of memory; "
            "choose smaller model keys"]


def recipe_resource_problems(recipe) -> list[str]:
    """Seeds and sizes the libraries accept, and a model this machine can hold (module doc)."""
    return seed_problems(recipe.train.seed) + vocab_problems(recipe.tokenizer.vocab_size) + memory_problems(recipe)
