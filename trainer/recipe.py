"""YAML recipes mapped onto typed dataclass sections.

A recipe is the whole description of a pretraining run. Loading is strict on purpose: unknown keys get a
"did you mean" suggestion, values are type-checked against the dataclass annotations, and every problem
in the file is reported at once (as litgpt's `validate_args` does) so a user fixes a recipe in one pass.
The resolved recipe (sizes applied, overrides applied) is saved beside each run so it can be reproduced.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, shorten
from ..models.config import type_problem
from ..models.head_config import POOLINGS
from ..models.sizes import sized_config
from ..ranges import POSITIVE, USUAL_PEAK_LR
from ..ranges import hints as _hints
from ..tokenization.sources import is_mixture, weights_note
from ..yamlfile import AliasBomb, check_expansion, safe_load
from .resources import recipe_resource_problems
from .sections import (AUTO_SIZE, OBJECTIVE_FOR_ARCH, PRECISIONS, SCHEDULES, TASK_METRICS, TASK_OBJECTIVES,  # noqa: F401 - re-exported
                       DataSection, EvalSection, LogSection, ModelSection, ObjectiveSection,
                       OptimSection, ScheduleSection, TaskSection, TokenizerSection, TrainSection,
                       auto_size_problems, downstream_recipe_problems, packing_problems)


@dataclass
class Recipe:
    name: str = "recipe"
    model: ModelSection = field(default_factory=ModelSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    data: DataSection = field(default_factory=DataSection)
    objective: ObjectiveSection = field(default_factory=ObjectiveSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    log: LogSection = field(default_factory=LogSection)
    task: TaskSection = field(default_factory=TaskSection)  # fine-tuning only (objective classify / regress)
    # the SECTION.KEY names that --set gave, not saved (recipe.yaml holds their values): a run started from a
    # checkpoint takes every model key from it except those given explicitly (source.source_model)
    overrides: tuple[str, ...] = field(default=(), compare=False)
    # the SECTION.KEY names the recipe file or --set wrote out (not those a model.size or a default filled): a run
    # started from a checkpoint keeps these of its dropouts and attention kernel, the checkpoint's others
    given: tuple[str, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)  # how it was chosen (trainer.resume), not saved: warnings
    planned: int | None = field(default=None, compare=False)  # the updates a plan predicted (trainer/plan.py)

    def problems(self) -> list[str]:
        """Every problem of every section, then the combinations across sections."""
        out = [p for s in SECTIONS for p in getattr(self, s).problems(s)]
        expected = OBJECTIVE_FOR_ARCH.get(self.model.arch)
        if expected and self.objective.name in OBJECTIVE_FOR_ARCH.values() and self.objective.name != expected:
            out.append(f"objective.name: {self.objective.name!r} does not train model.arch={self.model.arch!r} "
                       f"(expected {expected!r})")
        out += packing_problems(self.data, self.objective)
        out += auto_size_problems(self.model, self.train, self.head_task is not None)
        out += downstream_recipe_problems(self.eval, self.train, self.model.arch, self.head_task is not None)
        task = TASK_OBJECTIVES.get(self.objective.name)
        if task and not self.data.train:
            out.append("data.train: a fine-tuning recipe names its labelled data (a file or stdlib:topics)")
        if task and not self.train.init_from and not self.tokenizer.path:
            out.append("tokenizer.path: a fine-tuning run from random weights (train.init_from: null) reads text with "
                       "a given tokenizer, e.g. the pretrained run's tokenizer/ folder it is the control for")
        pools = POOLINGS.get(self.model.arch, ())
        if task and not self.train.init_from and pools and self.task.pooling not in (None, *pools):
            out.append(f"task.pooling: {self.task.pooling!r} is not a pooling of {self.model.arch} models "
                       f"(model.arch), which pool {' or '.join(pools)}")
        if task and self.task.metric not in ("auto", *TASK_METRICS[task]):
            out.append(f"task.metric: {self.task.metric!r} does not score objective.name={self.objective.name!r} "
                       f"(expected auto or one of {', '.join(TASK_METRICS[task])})")
        if self.data.seq_len > self.model.max_seq_len:
            out.append(f"data.seq_len: {self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")
        decays = self.schedule.name in ("linear", "cosine", "wsd") and POSITIVE.contains(self.optim.lr)
        if decays and self.schedule.min_lr > self.optim.lr:
            out.append(f"schedule.min_lr: {self.schedule.min_lr:g} exceeds optim.lr={self.optim.lr:g}, the peak it "
                       "decays from (expected min_lr <= lr)")
        if not out:  # sizes the libraries accept and a model this machine holds, once the keys are valid
            out += recipe_resource_problems(self)
        return out

    def warnings(self) -> list[str]:
        """Legal but probably unintended combinations, shown by `pretrain` and `recipes show|validate`.

        A warmup longer than the run is one: a quick `--set train.max_steps=20` try of a recipe that warms
        up over 30 steps is common and must run, but its learning rate never reaches optim.lr."""
        out = list(self.notes) + [note for note in (weights_note(self.data.train),) if note]
        s, warmup = self.schedule, self.schedule.warmup_steps
        if self.train.max_steps >= 1 and warmup > self.train.max_steps:
            out.append(f"schedule.warmup_steps: {warmup} exceeds train.max_steps="
                       f"{self.train.max_steps}, so the learning rate never reaches optim.lr")
        peak = self.optim.lr
        if s.name == "noam":  # the paper's schedule: optim.lr is a multiplier, the peak comes at warmup
            peak = self.optim.lr * self.model.d_model**-0.5 * max(warmup, 1) ** -0.5
            out.append(f"schedule.name: noam uses optim.lr={self.optim.lr:g} as a multiplier, not as the peak: the "
                       f"learning rate peaks at {peak:.3g} (lr * d_model^-0.5 * warmup_steps^-0.5) at step {warmup}")
        out += _peak_lr_warnings(self.optim, peak)
        if self.model.norm_placement == "post" and peak > POST_NORM_PEAK_LR:
            out.append(f"model.norm_placement: post-norm at a peak learning rate of {peak:.3g} ({warmup} warmup steps) "
                       "often stalls (post-norm is sensitive to the learning rate early on: Xiong et al., 2020); use "
                       f"model.norm_placement=pre, or a peak lr <= {POST_NORM_PEAK_LR:g} with a longer warmup")
        return out

    @property
    def head_task(self) -> str | None:
        """classification / regression for a fine-tuning recipe; None for pretraining."""
        return TASK_OBJECTIVES.get(self.objective.name)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as saved; the task section only in a fine-tuning recipe (a pretraining recipe.yaml is
        unchanged by its existence)."""
        dropped = ("overrides", "notes", "given", "planned") + (() if self.head_task else ("task",))
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in dropped}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _peak_lr_warnings(optim: OptimSection, peak: float) -> list[str]:
    """A peak learning rate (AdamW's `peak`, and Muon's when it runs) above the range that trains."""
    peaks = [("optim.lr", peak)] + ([("optim.muon_lr", optim.muon_lr)] if optim.name == "muon" else [])
    return [f"{key}: a peak learning rate of {value:.3g} is above {USUAL_PEAK_LR.high:g}, where training "
            "diverges (bundled recipes peak at 1e-4 to 3e-3, Muon's matrices at 0.02)"
            for key, value in peaks if POSITIVE.contains(value) and not USUAL_PEAK_LR.contains(value)]


SECTIONS = ("model", "tokenizer", "data", "objective", "optim", "schedule", "train", "eval", "log", "task")


def bundled_recipes() -> dict[str, Path]:
    """Name → path of every recipe shipped inside the package (they travel in the wheel)."""
    folder = resources.files("tfkit.recipes")
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def find_recipe(name_or_path: str) -> Path:
    """A path to an existing file, or the name of a bundled recipe."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"recipe {name_or_path}: is a folder, expected a YAML file or a bundled recipe name")
    bundled = bundled_recipes()
    if name_or_path in bundled:
        return bundled[name_or_path]
    hint = _suggest(name_or_path, bundled)
    raise ConfigError(f"recipe {name_or_path!r}: no such file and no bundled recipe of that name{hint} "
                      f"(bundled: {', '.join(sorted(bundled))})")


# A post-norm GPT at gpt-tiny's peak lr of 3e-3 (30 warmup steps) stalled: loss flat at 6.1-6.2 for 150 steps,
# pre-norm 3.96. The bundled post-norm recipes (bert-tiny, transformer-tiny) train well at 2e-3.
POST_NORM_PEAK_LR = 2e-3


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> Recipe:
    """Read, override (`key.sub=value` strings), type-check and validate a recipe; raise one ConfigError
    listing every problem."""
    path = find_recipe(name_or_path)
    try:
        raw = safe_load(path.read_text(encoding="utf-8"))
    except AliasBomb as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at position {exc.start}); "
                          "save it as UTF-8") from None
    if not raw:  # an empty or comment-only file: a truncated or wrong file, not "train every default"
        raise ConfigError(f"{path}: empty recipe, no sections; start from a bundled one "
                          "(`tfkit recipes show gpt-tiny > my.yaml`)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {type(raw).__name__}")
    set_problems: list[str] = []
    set_by: dict[str, str] = {}  # "section.key" -> the --set item that gave it its value (the last one wins)
    for item in overrides or []:
        key = _apply_override(raw, item, set_problems)
        if key:
            set_by[key] = item
    problems: list[str] = []
    recipe = recipe_from_dict(raw, default_name=path.stem, problems=problems)
    if problems or set_problems:  # each problem a readable length, though it quotes a 2 MB value
        raise ConfigError(_blame(path, [shorten(p, 300) for p in problems], set_by, set_problems), params=("overrides",))
    validate_on_own_corpus(recipe.data, valid_given="data.valid" in set_by)
    recipe.overrides = tuple(set_by)
    return recipe


def validate_on_own_corpus(data: DataSection, valid_given: bool) -> None:
    """A built-in corpus's validation split validates that corpus only: `--set data.train=grimm.txt` on a
    recipe whose data.valid is stdlib:docs:valid would measure Python docstrings, another domain, and say
    nothing about the user's text. So unless `--set data.valid=...` chose it, such a split becomes null:
    the run holds out part of data.train (seeded chunks spread through it) and says so."""
    if valid_given or not data.train or not isinstance(data.valid, str) or not data.valid.startswith("stdlib:"):
        return
    if is_mixture(data.train):  # a list of sources validates on each source's own held-out share
        data.valid = None
        return
    corpus = data.valid.split(":")[1] if data.valid.count(":") >= 1 else ""  # stdlib:docs:valid -> docs
    if not (data.train == f"stdlib:{corpus}" or data.train.startswith(f"stdlib:{corpus}:")):
        data.valid = None


def _blame(path: Path, problems: list[str], set_by: dict[str, str], set_problems: list[str]) -> str:
    """One line where each problem names its source: a problem that names a key given by `--set` is put
    after that override, not after the file (which may well be fine); the file's own problems follow
    its path. `set_problems` (overrides that could not be applied) already name themselves."""
    own, caused = [], list(set_problems)
    for problem in problems:
        items = [item for key, item in set_by.items()
                 if re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", problem)]
        if items:
            caused.append(" ".join(f"overrides {item}" for item in items) + f": {problem}")
        else:
            own.append(problem)
    return "; ".join(([f"{path}: " + "; ".join(own)] if own else []) + caused)


def recipe_from_dict(raw: dict, default_name: str = "recipe", problems: list[str] | None = None) -> Recipe:
    """Map a plain dict onto the sections. Problems are appended to `problems` (or raised when None)."""
    collect = [] if problems is None else problems
    raw = dict(raw)
    name = raw.pop("name", default_name)
    sections: dict[str, Any] = {}
    for key in raw:
        if key not in SECTIONS:
            collect.append(f"unknown section {key!r}{_suggest(key, SECTIONS)}")
    model_raw = _section_mapping(raw, "model", collect)
    size = model_raw.get("size")
    if size is not None:
        try:  # auto: the plan's shape (trainer/plan.py) replaces the tiny size's at the start of the run
            base = sized_config(model_raw.get("arch", "gpt"), "tiny" if size == AUTO_SIZE else size).to_dict()
            base["vocab_size"] = None
            model_raw = {**base, **model_raw}
        except ConfigError as exc:
            collect.append(str(exc))  # sized_config names the key at fault itself
    for section_name in SECTIONS:
        cls = _hints(Recipe)[section_name]
        values = model_raw if section_name == "model" else _section_mapping(raw, section_name, collect)
        sections[section_name] = _build_section(cls, values, section_name, collect)
    recipe = Recipe(name=str(name), **sections)
    recipe.given = tuple(sorted(f"{s}.{key}" for s in SECTIONS if isinstance(raw.get(s), dict) for key in raw[s]))
    _expand_home(recipe)
    # keys with a wrong type kept their (valid) defaults; a bad model.arch was already met by sized_config
    collect.extend(problem for problem in recipe.problems() if problem not in collect)
    if problems is None and collect:
        raise ConfigError("; ".join(collect))
    return recipe


PATH_KEYS = (("tokenizer", "path"), ("data", "cache_dir"), ("train", "init_from"), ("log", "run_dir"))


def _expand_home(recipe: Recipe) -> None:
    """`~` in a path key is the home folder, as in a shell (corpus specs get it from `resolve_files`).
    Left as is, `run_dir: ~/runs/x` made a folder named `~` in the working folder, one `rm -rf ~` away
    from deleting the home folder instead."""
    for section, key in PATH_KEYS:
        part = getattr(recipe, section)
        value = getattr(part, key)
        if isinstance(value, str) and value.startswith("~"):
            setattr(part, key, os.path.expanduser(value))


def _section_mapping(raw: dict, name: str, problems: list[str]) -> dict:
    value = raw.get(name) or {}
    if not isinstance(value, dict):
        problems.append(f"{name}: expected a mapping of keys, got {type(value).__name__}")
        return {}
    return value


def _build_section(cls: type, values: dict, prefix: str, problems: list[str]) -> Any:
    hints = _hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            problems.append(f"{prefix}.{key}: unknown key{_suggest(key, hints)}")
            continue
        value = _as_float(value) if hints[key] in (float, float | None) else value
        problem = type_problem(value, hints[key])
        if problem:
            problems.append(f"{prefix}.{key}: got {value!r}, expected {problem}")
            continue
        kwargs[key] = value
    return cls(**kwargs)


def _as_float(value: Any) -> Any:
    """Floats as users write them: PyYAML reads `3e-4` (no dot) as a string, and `1` as an int."""
    if isinstance(value, bool) or value is None:
        return value
    try:
        return float(value) if isinstance(value, (int, str)) else value
    except ValueError:
        return value


def parse_override(item: str) -> tuple[str, str, Any]:
    """(section, key, value) of `section.key=value` as `load_recipe` applies it, the value parsed for the key's
    type (`_override_value`, `_as_float`), so two spellings of one setting compare equal; ConfigError naming
    the item when it is not SECTION.KEY=VALUE of a known section (an unknown key is the loader's to report)."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ConfigError(f"overrides {item!r}: expected SECTION.KEY=VALUE, e.g. train.max_steps=20")
    section, name = parts
    if section not in SECTIONS:
        raise ConfigError(f"overrides {item}: unknown section {section!r}{_suggest(section, SECTIONS)}")
    hint = _hints(_hints(Recipe)[section]).get(name)
    value = _override_value(text, hint)
    return section, name, _as_float(value) if hint in (float, float | None) else value  # `3e-4` is a float


def _apply_override(raw: dict, item: str, problems: list[str]) -> str | None:
    """Apply `section.key=value` and return "section.key", or append a problem and return None."""
    try:
        section, name, value = parse_override(item)
    except ConfigError as exc:
        problems.append(str(exc))
        return None
    if raw.get(section) is None:
        raw[section] = {}
    if isinstance(raw[section], dict):  # else the file's own "expected a mapping" problem is reported
        raw[section][name] = value
    return f"{section}.{name}"


_YAML_NULLS = ("", "~", "null", "Null", "NULL")


def _override_value(text: str, hint: Any) -> Any:
    """The value of `--set key=text`, parsed as YAML so `20`, `true`, `null`, `3e-4` get their types.

    Text keys take the text literally when YAML reads something else: the shell has already removed the
    user's quotes, so `eval.sample_prompt="ROMEO:"` arrives as `ROMEO:`, which YAML reads as a mapping.
    A null spelling still means None where the key allows it."""
    try:
        value = yaml.safe_load(text)
        check_expansion(value)
    except (yaml.YAMLError, AliasBomb, RecursionError):
        return text
    if hint in (str, str | None) and not isinstance(value, str):
        return None if hint == str | None and text.strip() in _YAML_NULLS else text
    return value


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
