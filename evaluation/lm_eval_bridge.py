"""A tfkit GPT checkpoint as an lm-evaluation-harness model, so any of its tasks runs on one.

Needs the optional extra (`pip install 'tfkit[lm-eval]'`); nothing else in tfkit imports this module.
Importing it registers the model as `tfkit`:

    import lm_eval, tfkit.evaluation.lm_eval_bridge
    lm_eval.simple_evaluate(model="tfkit", model_args="pretrained=runs/gpt-small", tasks=["hellaswag"])

or pass `TfkitLM("runs/gpt-small")` itself as `model=`. Log-likelihoods come from the scorer behind
`tfkit eval --task` (`evaluation/loglikelihood.py`: lm-eval's framing, each context run once for the
continuations that share it), so a task file scored both ways gives the same numbers; rolling
log-likelihoods (perplexity tasks) score a text in lm-eval's disjoint windows of max_seq_len tokens
after the document prefix; generate-until decodes greedily over tfkit's static KV cache.
"""

from __future__ import annotations

from pathlib import Path

from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

import lm_eval.models  # noqa: F401 - the built-in models first: a registry that is not empty is never filled

from ..errors import ConfigError
from ..models.framing import continuation
from ..models.generation import generate
from .loglikelihood import Group
from .task_scores import load_scorer

DEFAULT_GEN_TOKENS = 256  # lm-eval's own default for `max_gen_toks`


@register_model("tfkit")
class TfkitLM(LM):
    """lm-eval's three request types, answered by a tfkit checkpoint (folder or run folder)."""

    def __init__(self, pretrained: str | Path, batch_size: int | str = 8, device: str | None = "cpu",
                 dtype: str = "fp32", max_batch_size: int | None = None) -> None:
        """`max_batch_size` is lm-eval's bound for `batch_size=auto`, which tfkit does not search: unused."""
        super().__init__()
        if not str(batch_size).isdigit():  # lm-eval's "auto" searches for what fits a GPU: give a number
            raise ConfigError(f"batch_size: got {batch_size!r}, expected a number of sequences per forward")
        self.scorer, self.info = load_scorer(pretrained, batch_size=int(batch_size), device=device or "cpu",
                                             dtype=dtype)
        self.tokenizer = self.scorer.tokenizer

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-likelihood, greedy) of each continuation; requests with the same context share its forward."""
        pairs = [self.scorer.encode_pair(*request.args) for request in requests]
        groups: dict[tuple[int, ...], Group] = {}
        where = []  # (group key, index of the continuation in its group) per request
        for context, ids in pairs:
            group = groups.setdefault(tuple(context), Group(context, []))
            where.append((tuple(context), len(group.continuations)))
            group.continuations.append(ids)
        keys = list(groups)
        scored = dict(zip(keys, self.scorer.score([groups[k] for k in keys])))
        return [scored[key][n] for key, n in where]

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """Each text's total log-likelihood, its tokens predicted in disjoint windows of max_seq_len."""
        prefix = self.scorer.prefix
        if not prefix:
            raise ConfigError(f"{self.info['checkpoint']}: its tokenizer has no separator or BOS to start a "
                              "rolling window from")
        out = []
        for request in requests:
            windows = get_rolling_token_windows(token_list=self.tokenizer.encode(request.args[0]),
                                                prefix_token=prefix[0], max_seq_len=self.scorer.max_len, context_len=1)
            groups = [Group(context, [ids]) for context, ids in map(make_disjoint_window, windows)]
            out.append(sum(scores[0][0] for scores in self.scorer.score(groups)))
        return out

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, each cut before the first of its `until` strings."""
        out = []
        for request in requests:
            context, options = request.args
            until = options.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            new_tokens = int(options.get("max_gen_toks", DEFAULT_GEN_TOKENS))
            prompt = self.scorer.prefix + self.tokenizer.encode(context)
            prompt = prompt[-max(1, self.scorer.max_len - new_tokens):]  # lm-eval cuts the context's left
            new = generate(self.scorer.model, [prompt], new_tokens, temperature=0.0,
                           eos_id=self.tokenizer.separator_id)[0]
            text = continuation(self.tokenizer, prompt, new)
            for stop in until:
                text = text.split(stop)[0] if stop else text
            out.append(text)
        return out
