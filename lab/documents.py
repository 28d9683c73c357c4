"""How documents fall into packed rows: the figures that say whether a document mask can matter at all.

A document mask changes nothing for a token whose packed row holds no other document before it. So a lab
that scores whole documents (`whole_documents`) reports, for its training text and each eval text at
data.seq_len, how many documents a packed row holds on average and the share of tokens that have another
document's tokens before them in their row: what default packing lets them attend to and a document mask
hides. Rows are cut as `ClmDataset` cuts them (blocks of seq_len inputs over the stream, documents back to
back, each ending with its separator), and a token's document comes from the shards' doc_starts, the
boundaries training uses (tokenization/packing.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .jobs import Lab


def packing_figures(doc_starts: np.ndarray, num_tokens: int, seq_len: int) -> dict:
    """{documents, median_tokens, rows, documents_per_row, after_another} of a stream cut into rows of
    `seq_len` inputs; `after_another` is the share of the rows' tokens whose row holds another document
    before them."""
    rows = max(0, (num_tokens - 1) // seq_len)
    lengths = np.diff(np.asarray(doc_starts, np.int64))
    out = {"documents": int(len(lengths)), "median_tokens": float(np.median(lengths)) if len(lengths) else 0.0,
           "seq_len": seq_len, "rows": rows, "documents_per_row": 0.0, "after_another": 0.0}
    if rows == 0:
        return out
    docs = np.searchsorted(doc_starts, np.arange(rows * seq_len), side="right") - 1  # (rows * T,)
    docs = docs.reshape(rows, seq_len)  # (rows, T): each input position's document
    first = docs[:, :1]  # (rows, 1): the document the row opens with (documents only grow along a row)
    out["documents_per_row"] = float((docs[:, -1] - first[:, 0] + 1).mean())
    out["after_another"] = float((docs != first).mean())
    return out


def document_figures(lab: Lab) -> dict:
    """{"train": figures, LABEL: figures...} for the training text and every eval text of the lab, tokenized
    by the reference's tokenizer (the lab's token cache), each with its corpus spec as `text`."""
    from ..tokenization.shards import prepare_tokens
    from ..tokenization.train import load_tokenizer

    job = next(j for j in lab.jobs if j.name == lab.spec.reference and j.kind == "train")
    recipe = lab.recipes[job.key]
    tokenizer = load_tokenizer(recipe.tokenizer.path)
    texts = {"train": recipe.data.train, **lab.evals}
    out = {}
    for key, text in texts.items():
        shards = prepare_tokens(text, tokenizer, lab.folder / "data", text_field=recipe.data.text_field,
                                show_progress=False)
        out[key] = {"text": text, **packing_figures(shards.doc_starts, shards.num_tokens, recipe.data.seq_len)}
    return out


def document_lines(results: dict) -> list[str]:
    """The figures as results.md lines (empty when the lab did not score whole documents)."""
    figures = results.get("documents")
    if not figures:
        return []
    out = ["How documents fall into packed rows (blocks of data.seq_len tokens, documents back to back): a "
           "document mask only changes what a token sees when its row holds another document before it.", ""]
    for key, f in figures.items():
        what = f"training text `{f['text']}`" if key == "train" else f"{key} (`{f['text']}`)"
        out.append(f"- {what}: {f['documents']:,} documents, median {f['median_tokens']:.0f} tokens; a row of "
                   f"{f['seq_len']} tokens holds {f['documents_per_row']:.2f} documents on average, and "
                   f"{f['after_another']:.0%} of its tokens have another document before them in their row")
    out += ["", "Columns LABEL@whole score the same text document by document: each document from its own start "
            "(after its separator), never after another document's tail, under the layout each checkpoint "
            "trained with (its document mask and restarted positions)."]
    return out
