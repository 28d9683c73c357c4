"""Chat fine-tuning data (`data.format: chat`): conversations, the chat template and the tokenizer's growth.

A conversation is a list of `(role, content)` turns read from JSONL (plain, `.gz`, `.zst`) or Parquet, in
either layout people download: `{prompt, response}` pairs (a user turn and an assistant turn) or chat
`messages` (a list of `{role, content}`). The template frames every turn as `<|ROLE|>content<|end|>`, with
one special token per role and one for the end of a turn. The tokenizer grows by those tokens (the model's
embeddings grow with it, models/resize.py), and the same template is saved as HF's `chat_template`, so
`apply_chat_template` on an exported folder gives the ids `encode_chat` gives.

Each content is encoded on its own between special tokens, which is how a tokenizer splits the whole
rendered text anyway (added tokens cut the text before the pre-tokenizer sees it): the ids are the same,
and each token knows which turn it came from. The loss is on the assistant's tokens only: its content and
the `<|end|>` that closes it (so the model learns to stop); its `<|assistant|>` marker is the prompt.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import DataError
from .labelled_rows import Row, read_rows
from .tokenizer import TfkitTokenizer, parse_tokenizer, tokenizer_files

ROLES = ("system", "user", "assistant")
END = "<|end|>"  # closes every turn; generation stops at it
CHAT_TOKENS = [*(f"<|{role}|>" for role in ROLES), END]
# HF's chat_template (Jinja): the same framing, `add_generation_prompt` opening the assistant's turn
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")

Turn = tuple[str, str]  # (role, content)


def grow_tokenizer(tokenizer: TfkitTokenizer) -> TfkitTokenizer:
    """The tokenizer with the chat tokens added as specials (those it lacks, at the end of its vocabulary)
    and the chat template in its tokenizer_config.json. A tokenizer that has them all comes back as is."""
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    missing = [t for t in CHAT_TOKENS if t not in vocab]
    if not missing and tokenizer.chat_template == CHAT_TEMPLATE:
        return tokenizer
    grown = Tokenizer.from_str(tokenizer.tokenizer.to_str())
    grown.add_special_tokens(missing)
    extra = [*tokenizer.extra_specials, *(t for t in CHAT_TOKENS if t not in tokenizer.extra_specials)]
    files = tokenizer_files(grown, tokenizer.kind, tokenizer.roles, extra, tokenizer.spec, CHAT_TEMPLATE)
    return parse_tokenizer(files["tokenizer.json"], files["tokenizer_config.json"], tokenizer.path)


def chat_ids(tokenizer: TfkitTokenizer) -> dict[str, int]:
    """Marker -> id of every chat token; DataError naming the tokenizer when one is missing."""
    ids = {token: tokenizer.token_to_id(token) for token in CHAT_TOKENS}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        raise DataError(f"tokenizer {tokenizer.path}: has no chat token {', '.join(missing)} (a model fine-tuned "
                        "with data.format: chat has them)")
    return ids


def encode_chat(tokenizer: TfkitTokenizer, turns: list[Turn], generation_prompt: bool = False,
                where: str = "chat") -> tuple[list[int], list[bool]]:
    """(ids, trained): the template's ids and, per id, whether the loss is on it (assistant content and
    its <|end|>). `generation_prompt` appends `<|assistant|>` for the model to answer."""
    marks = chat_ids(tokenizer)
    ids: list[int] = []
    trained: list[bool] = []
    for role, content in turns:
        body = tokenizer.encode(content) + [marks[END]]
        if content and len(body) == 1:
            raise DataError(f"{where}: {role} content {content[:40]!r} encodes to no tokens")
        ids += [marks[f"<|{role}|>"], *body]
        trained += [False, *([role == "assistant"] * len(body))]
    if generation_prompt:
        ids.append(marks["<|assistant|>"])
        trained.append(False)
    return ids, trained


def read_conversations(path: str | Path) -> Iterator[tuple[str, list[Turn]]]:
    """(where, turns) for each record of a chat file: `{prompt, response}` or `{messages: [{role, content}]}`.
    A record with an unknown role, a missing field or no assistant turn is a DataError naming its line."""
    for row in read_rows(Path(path), what="chat data"):
        yield row.where, _turns(row)


def _turns(row: Row) -> list[Turn]:
    record = dict(zip(row.names or [], row.values))
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{row.where}: field messages: expected a non-empty list of {{role, content}}")
        turns = [_message(row.where, k, m) for k, m in enumerate(messages)]
    elif "prompt" in record and "response" in record:
        turns = [("user", _text(row.where, "prompt", record["prompt"])),
                 ("assistant", _text(row.where, "response", record["response"]))]
    else:
        raise DataError(f"{row.where}: expected fields prompt and response, or messages; found "
                        f"{', '.join(map(str, record)) or 'none'}")
    if not any(role == "assistant" for role, _ in turns):
        raise DataError(f"{row.where}: field messages: no assistant turn, so nothing to train on")
    return turns


def _message(where: str, k: int, message: object) -> Turn:
    field = f"messages[{k}]"
    if not isinstance(message, dict):
        raise DataError(f"{where}: field {field}: expected an object with role and content")
    role = message.get("role")
    if role not in ROLES:
        raise DataError(f"{where}: field {field}.role: got {role!r}, expected one of {', '.join(ROLES)}")
    return role, _text(where, f"{field}.content", message.get("content"))


def _text(where: str, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field}: expected text, got {type(value).__name__}")
    return value
