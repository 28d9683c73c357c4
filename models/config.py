"""The one configuration dataclass shared by every model family (BERT, GPT, encoder-decoder).

One class rather than one per family because the families differ in a single field (`arch`) and share
every design choice tfkit lets you compare (attention layout, positions, norms, FFN). `validate()`
returns *every* problem at once, each naming its field, so a recipe loader can report them together.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..ranges import POSITIVE, float_problems, hints

ARCHS = ("bert", "gpt", "transformer")
ATTENTIONS = ("flash", "naive")
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
NORMS = ("layernorm", "rmsnorm", "batchnorm")
ATTN_SCALES = ("sqrt_d", "none")  # or a positive number
ATTN_SCORES = ("dot", "additive")
PAD_FILLS = ("-inf",)  # or a number <= 0
NORM_PLACEMENTS = ("pre", "post")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
INITS = ("normal", "xavier", "t5")
ROPE_SCALINGS = (None, "linear", "yarn")


@dataclass
class ModelConfig:
    arch: str = "gpt"  # bert (encoder, MLM) | gpt (decoder, causal LM) | transformer (encoder-decoder)
    vocab_size: int = 8192  # set from the tokenizer by the trainer; embedding rows
    d_model: int = 256  # residual stream width
    n_layers: int = 4  # blocks per stack (the transformer has this many in encoder *and* decoder)
    n_heads: int = 4  # query heads
    n_kv_heads: int | None = None  # key/value heads: None or n_heads = MHA, 1 = MQA, otherwise GQA
    d_ff: int | None = None  # FFN hidden size; None = 4*d_model (relu/gelu) or 8/3*d_model rounded (swiglu)
    max_seq_len: int = 512  # longest sequence (learned positions table size, KV-cache length)
    attention: str = "flash"  # flash = fused SDPA kernels; naive = explicit softmax(QK^T/sqrt(d)+mask)V
    # factor on the attention scores QK^T: sqrt_d = 1/sqrt(head_dim) (the paper's) | none = 1.0 (unscaled:
    # the softmax saturates as head_dim grows) | a positive number = that factor
    attn_scale: str | float = "sqrt_d"
    # the compatibility function of query and key: dot = q·k (times attn_scale) | additive = w_h·tanh(q + k), a
    # one-hidden-layer network per head (Bahdanau et al., 2015; Vaswani et al., 2017, section 3.2.1), which no fused
    # kernel computes: it needs attention: naive and keeps attn_scale: sqrt_d (there is no product to scale)
    attn_score: str = "dot"
    # the query projection also makes the keys (Reformer's shared-QK attention): each key is its token's query
    # normalised to unit length, and a token attends to itself only when no other key is visible; no k_proj
    shared_qk: bool = False
    # the key projection also makes the values (K = V): each value is its token's key before QK-norm and RoPE; no
    # v_proj, half the key/value parameters of an attention block (the KV cache stays the same size)
    shared_kv: bool = False
    positions: str = "learned"  # learned | sinusoidal | rope | alibi | none (no position information at all)
    rope_theta: float = 10000.0  # RoPE base frequency
    # RoPE context extension (models/rope_scaling.py): null | linear (position interpolation) | yarn (YaRN);
    # the model was trained at max_seq_len / rope_factor and runs at max_seq_len (eval or fine-tune longer)
    rope_scaling: str | None = None
    rope_factor: float = 1.0  # with rope_scaling: max_seq_len over the trained length (>= 1)
    # layernorm | rmsnorm | batchnorm (each feature over the batch's positions, padding left out, running
    # statistics in eval mode; while training, a causal model's tokens see the batch's future: models/norms.py)
    norm: str = "layernorm"
    norm_placement: str = "pre"  # pre (GPT-2, stable deep) | post (original Transformer, BERT)
    # normalise q and k of each head before RoPE (QK-norm: OLMo 2, Qwen3, nanochat), by the `norm` kind
    # (layernorm or rmsnorm) over head_dim, one weight shared by the heads: keeps attention logits bounded
    qk_norm: bool = False
    # sliding-window attention: a query sees only the keys fewer than `window` positions away (behind it when
    # causal, either side when not); null = the whole sequence. The KV cache stays full-size under a band mask
    window: int | None = None
    # with window: every global_every-th layer (the K-th, 2K-th, ... counting from 1) attends over the whole
    # sequence, the others within the window (Gemma's local/global, ModernBERT's); null = every layer windowed
    global_every: int | None = None
    norm_eps: float = 1e-5  # added to the variance in every norm (BERT: 1e-12)
    activation: str = "gelu"  # relu (original) | gelu (BERT) | gelu_tanh (GPT-2's approximation) | swiglu (Llama)
    bias: bool = True  # biases in linear layers and LayerNorm
    tie_embeddings: bool = True  # output projection shares the input embedding matrix
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model), as the original paper
    dropout: float = 0.0  # on embeddings and residual branches
    attn_dropout: float = 0.0  # on attention probabilities
    # normal (std init_std, residual projections scaled by 1/sqrt(2*n_layers)) | xavier | t5 (xavier, the query
    # projection divided by sqrt(head_dim): T5's unscaled attention folds the 1/sqrt(d) into W_q's init instead)
    init: str = "normal"
    init_std: float = 0.02  # standard deviation of the normal init
    type_vocab_size: int = 2  # BERT segment (token type) embeddings; 0 disables them
    pad_token_id: int | None = None  # the tokenizer's padding id (HF export); masks come from attention_mask
    # what is added to a padding key's attention score: -inf = hidden exactly (weight 0) | a number <= 0: -10000
    # is the original BERT code's (exp(-10000) is 0 in every float type), 0 = no padding mask (padding is attended);
    # causal, document and window masks stay exact whatever this is
    pad_fill: str | float = "-inf"
    # residual connections around every sublayer (x + f(x)); false = each sublayer's output replaces its input
    # (f(norm(x)) pre-norm, norm(f(x)) post-norm), the plain stack of He et al., 2016
    residual: bool = True
    # ALBERT's cross-layer sharing (Lan et al., 2020, section 3.1, "all-shared"): one block's weights applied
    # n_layers times, so a stack holds one block's parameters (each stack of the encoder-decoder its own block)
    share_layers: bool = False

    def __post_init__(self) -> None:
        """A number written as text (YAML reads `1e-1` without a dot as a string) becomes a float, an int a
        float, so `attn_scale` is one of its two spellings or a float from here on."""
        if isinstance(self.attn_scale, str) and self.attn_scale not in ATTN_SCALES:
            try:
                self.attn_scale = float(self.attn_scale)
            except ValueError:
                pass  # problems() names it
        elif isinstance(self.attn_scale, int) and not isinstance(self.attn_scale, bool):
            self.attn_scale = float(self.attn_scale)
        fill = self.pad_fill
        if isinstance(fill, str) and fill not in PAD_FILLS:
            try:
                fill = float(fill)
            except ValueError:
                pass  # problems() names it
        if isinstance(fill, (int, float)) and not isinstance(fill, bool):  # YAML's -.inf is a float: one spelling
            fill = "-inf" if fill == float("-inf") else float(fill)
        self.pad_fill = fill

    @property
    def score_scale(self) -> float | None:
        """The factor attention multiplies QK^T by; None = 1/sqrt(head_dim), SDPA's own default, so the
        default configuration passes nothing and computes exactly what it always did."""
        if self.attn_scale == "sqrt_d":
            return None
        return 1.0 if self.attn_scale == "none" else float(self.attn_scale)

    @property
    def padding_fill(self) -> float:
        """The number added to a padding key's score (`pad_fill`): -inf, the default, or a finite one <= 0."""
        return float(self.pad_fill)

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads actually used (resolves None to n_heads)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def stored_layers(self) -> int:
        """Blocks per stack that hold parameters of their own: 1 when `share_layers`, else n_layers."""
        return 1 if self.share_layers else self.n_layers

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        """FFN hidden size; SwiGLU uses 2/3 of 4*d_model (rounded up to 64) to keep parameters equal."""
        if self.d_ff is not None:
            return self.d_ff
        if self.activation == "swiglu":
            return -(-int(8 * self.d_model / 3) // 64) * 64
        return 4 * self.d_model

    def problems(self, prefix: str = "model") -> list[str]:
        """Every invalid field or impossible combination, each as one line naming the key."""
        out: list[str] = []

        def choice(name: str, allowed: tuple[str, ...]) -> None:
            value = getattr(self, name)
            if value not in allowed:
                out.append(f"{prefix}.{name}: got {value!r}, expected one of {', '.join(allowed)}")

        choice("arch", ARCHS)
        choice("attention", ATTENTIONS)
        choice("positions", POSITIONS)
        choice("norm", NORMS)
        choice("norm_placement", NORM_PLACEMENTS)
        choice("activation", ACTIVATIONS)
        choice("init", INITS)
        choice("attn_score", ATTN_SCORES)
        scale = self.attn_scale
        if isinstance(scale, str) and scale not in ATTN_SCALES or isinstance(scale, bool) or (
                isinstance(scale, float) and not POSITIVE.contains(scale)):
            out.append(f"{prefix}.attn_scale: got {scale!r}, expected sqrt_d, none or a positive finite number")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
            if getattr(self, name) < 1:
                out.append(f"{prefix}.{name}: got {getattr(self, name)}, expected a positive integer")
        if self.n_kv_heads is not None and self.n_kv_heads < 1:
            out.append(f"{prefix}.n_kv_heads: got {self.n_kv_heads}, expected a positive integer or null")
        if self.d_ff is not None and self.d_ff < 1:
            out.append(f"{prefix}.d_ff: got {self.d_ff}, expected a positive integer or null")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                out.append(f"{prefix}.{name}: got {getattr(self, name)}, expected 0 <= value < 1")
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            out.append(
                f"{prefix}.d_model: {self.d_model} is not divisible by {prefix}.n_heads={self.n_heads}"
            )
        if self.n_heads >= 1 and self.kv_heads >= 1 and self.n_heads % self.kv_heads:
            out.append(
                f"{prefix}.n_kv_heads: {self.n_heads} query heads cannot be split into "
                f"{self.kv_heads} key/value groups (n_heads % n_kv_heads must be 0)"
            )
        if self.positions == "rope" and self.n_heads >= 1 and self.head_dim % 2:
            out.append(f"{prefix}.positions: rope needs an even head size, got d_model/n_heads={self.head_dim}")
        if self.qk_norm and self.norm not in ("layernorm", "rmsnorm"):
            out.append(f"{prefix}.qk_norm: normalises each head of q and k by {prefix}.norm, which must be layernorm "
                       f"or rmsnorm (got {self.norm!r}: a batch statistic per head is no QK-norm)")
        out += self._window_problems(prefix) + self._rope_scaling_problems(prefix) + self._attention_problems(prefix)
        if self.type_vocab_size < 0:
            out.append(f"{prefix}.type_vocab_size: got {self.type_vocab_size}, expected >= 0")
        return out + float_problems(self, prefix, rope_theta=POSITIVE, norm_eps=POSITIVE, init_std=POSITIVE,
                                    rope_factor=POSITIVE)

    def _attention_problems(self, prefix: str) -> list[str]:
        """The score, shared-QK and padding-fill options: what no path computes is refused, never ignored."""
        out = []
        if self.attn_score == "additive" and self.attention != "naive":
            out.append(f"{prefix}.attn_score: additive scores need {prefix}.attention: naive (the fused SDPA kernels "
                       f"compute dot products only; got attention {self.attention!r})")
        if self.attn_score == "additive" and self.attn_scale != "sqrt_d":
            out.append(f"{prefix}.attn_scale: got {self.attn_scale!r}, but additive scores ({prefix}.attn_score) have "
                       "no dot product to scale (expected sqrt_d, the default)")
        if self.shared_qk and self.n_kv_heads is not None and self.n_kv_heads != self.n_heads:
            out.append(f"{prefix}.shared_qk: the keys are the queries' projection, one per query head, so "
                       f"{prefix}.n_kv_heads must be null or {self.n_heads} (got {self.n_kv_heads})")
        if self.shared_qk and self.shared_kv:
            out.append(f"{prefix}.shared_kv: with {prefix}.shared_qk the keys are the normalised queries, so K = V would make "
                       "every projection one (expected one of shared_qk or shared_kv, not both)")
        if self.shared_qk and self.arch == "transformer":
            out.append(f"{prefix}.shared_qk: shares a self-attention's query and key projection (Reformer), but arch "
                       "transformer's cross-attention takes its keys from the encoder (expected arch gpt or bert)")
        fill = self.pad_fill
        if not (fill in PAD_FILLS or isinstance(fill, float) and math.isfinite(fill) and fill <= 0.0):
            out.append(f"{prefix}.pad_fill: got {fill!r}, expected -inf or a finite number <= 0 (e.g. -10000 or 0)")
        return out

    def _window_problems(self, prefix: str) -> list[str]:
        out = []
        if self.window is not None and not 1 <= self.window <= self.max_seq_len:
            out.append(f"{prefix}.window: got {self.window}, expected 1 <= window <= {prefix}.max_seq_len="
                       f"{self.max_seq_len} (or null: no window)")
        if self.global_every is not None and self.window is None:
            out.append(f"{prefix}.global_every: got {self.global_every} without {prefix}.window (expected a window "
                       "for the other layers, or null)")
        elif self.global_every is not None and not 1 <= self.global_every <= self.n_layers:
            out.append(f"{prefix}.global_every: got {self.global_every}, expected 1 <= global_every <= "
                       f"{prefix}.n_layers={self.n_layers} (so that some layer attends globally)")
        return out

    def _rope_scaling_problems(self, prefix: str) -> list[str]:
        out = []
        if self.rope_scaling not in ROPE_SCALINGS:
            out.append(f"{prefix}.rope_scaling: got {self.rope_scaling!r}, expected linear, yarn or null")
        elif self.rope_scaling is not None and self.positions != "rope":
            out.append(f"{prefix}.rope_scaling: {self.rope_scaling} scales RoPE, but {prefix}.positions is "
                       f"{self.positions} (expected positions: rope, or rope_scaling: null)")
        if self.rope_scaling is None and self.rope_factor != 1.0:
            out.append(f"{prefix}.rope_factor: got {self.rope_factor:g} without {prefix}.rope_scaling (expected "
                       "linear or yarn, or rope_factor 1)")
        elif self.rope_factor < 1.0:
            out.append(f"{prefix}.rope_factor: got {self.rope_factor:g}, expected >= 1 (how many times longer "
                       "than the trained length)")
        return out

    def windowed(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends within `window`: all do, but every global_every-th."""
        if self.window is None:
            return False
        return self.global_every is None or (layer + 1) % self.global_every != 0

    def validate(self) -> "ModelConfig":
        """Raise ConfigError listing every problem; return self so calls can chain."""
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str | Path | None = None) -> "ModelConfig":
        """Build from a saved config.json section. JSON values are type-checked against the annotations
        before anything compares them (a string n_layers would otherwise crash `problems()` with a
        TypeError); unknown keys, wrong types and invalid values are reported at once as one ConfigError,
        prefixed by `source` (the file) when given."""
        declared = hints(cls)
        problems: list[str] = []
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in declared:
                problems.append(f"model.{key}: unknown key")
                continue
            expected = type_problem(value, declared[key])
            if expected:
                problems.append(f"model.{key}: got {value!r}, expected {expected}")
                continue
            values[key] = float(value) if declared[key] is float else value  # an int is a valid float
        config = cls(**values)
        problems += config.problems()  # a key with a wrong type kept its default: no crash here
        if problems:
            raise ConfigError((f"{source}: " if source else "") + "; ".join(problems))
        return config


def type_problem(value: Any, hint: Any) -> str | None:
    """None when `value` fits the annotation, else what was expected ("an integer", "a number or null").

    Strict as JSON and YAML values need: bool is not an int (True would pass `isinstance(v, int)`), an int is
    a number but a float is not an integer, and a string is never a number. Shared by recipes and
    config.json loading so both say the same thing about the same mistake."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is bool and isinstance(value, bool):
            return None
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if option is str and isinstance(value, str):
            return None
        if option is dict and isinstance(value, dict):  # a mapping checked by its owner (tokenization.sources)
            return None
        if typing.get_origin(option) is list and isinstance(value, list):
            (inner,) = typing.get_args(option)
            if all(type_problem(v, inner) is None for v in value):
                return None
    names = {type(None): "null", bool: "true/false", int: "an integer", float: "a number", str: "a string",
             dict: "a mapping"}
    lists = {str: "a list of strings", float: "a list of numbers", int: "a list of integers",
             dict: "a list of mappings"}
    return " or ".join(names.get(o) or lists.get(typing.get_args(o)[0], "a list") for o in options)
