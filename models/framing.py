"""Text in and out of generation: a prompt laid out as the model's training documents were (`frame_prompt`),
a chat message framed by the template the model was fine-tuned with (`frame_chat`), and the new ids read
back as the text that follows the prompt (`continuation`). Token ids only; the decoding over the KV cache
is generation.py's.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..tokenization.chat import END, chat_ids, encode_chat


def frame_prompt(tokenizer, text: str, arch: str) -> tuple[list[int], list[int] | None]:
    """(decoder prompt, encoder source) token ids, laid out exactly as the training batches were.

    GPT: training packs documents as `doc EOS doc EOS ...` (EOS, or [SEP] without one), so a document
    starts right after the separator; prefixing it conditions the model on "a new document begins".
    Tokenizers that begin documents with their own BOS (Llama's `<s>`) get that instead
    (`TfkitTokenizer.document_prefix`). Encoder-decoder: the source is `text EOS`, and the decoder
    starts from BOS (or [CLS]).
    """
    sep = tokenizer.separator_id
    if arch != "transformer":
        return tokenizer.document_prefix() + tokenizer.encode(text), None
    bos = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.cls_id
    if bos is None or sep is None:
        raise ConfigError("text: the checkpoint's tokenizer has no BOS/EOS tokens to frame a seq2seq source",
                          params=("text",))
    return [bos], tokenizer.encode(text) + [sep]


def frame_chat(tokenizer, message: str, system: str | None = None) -> tuple[list[int], int]:
    """(prompt ids, end-of-turn id) of a one-message chat (a `system` turn first when given), framed by the
    template the model was fine-tuned with (tokenization/chat.py) and opening the assistant's turn; the
    answer ends at the end-of-turn token."""
    turns = ([("system", system)] if system is not None else []) + [("user", message)]
    ids, _ = encode_chat(tokenizer, turns, generation_prompt=True, where="the chat message")
    return ids, chat_ids(tokenizer)[END]


def continuation(tokenizer, prompt: list[int], new: list[int], head: str | None = None) -> str:
    """The text `new` adds after `prompt` (whose text `head` is, when the caller has it already).

    WordPiece and Metaspace decoders drop the space before a word at the start of a text, so decoding
    `new` alone loses the space between prompt and continuation ("ROMEO: I" + "in" read "in", not " in");
    decoding both and cutting the prompt's text off keeps it. Falls back to `new` alone where the joint
    text does not start with the prompt's."""
    head = tokenizer.decode(prompt) if head is None else head
    whole = tokenizer.decode(prompt + new)
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new)
