"""`tfkit import-hf` / `tfkit export-hf` through CliRunner: exit 0 with the output folder on stdout and
warnings on stderr, exit 2 with one line naming the problem; and, when the teammates' commands exist,
an imported Llama and BERT go through `convert-mqa-to-gqa`, `eval` and back out to transformers."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from typer.testing import CliRunner

from tfkit.cli.main import app

from helpers import HF_TEXT, hf_folder

transformers = pytest.importorskip("transformers")

IDS = torch.randint(5, 280, (2, 12), generator=torch.Generator().manual_seed(1))


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_import_prints_the_folder_on_stdout_and_news_on_stderr(tmp_path):
    result = run("import-hf", hf_folder(tmp_path / "hf", "gpt2"), "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "ckpt")
    assert "imported GPT2LMHeadModel as gpt" in result.stderr
    assert "warning: activation_function" not in result.stderr  # gelu_new maps exactly onto gelu_tanh


def test_bare_bert_import_warns_about_the_initialised_head(tmp_path):
    result = run("import-hf", hf_folder(tmp_path / "hf", "bert"), "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    assert "warning: BertModel has no MLM head" in result.stderr


def test_import_errors_exit_2_with_one_line(tmp_path):
    src = hf_folder(tmp_path / "hf", "gpt2")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    result = run("import-hf", src, "--out", tmp_path / "taken")
    assert result.exit_code == 2 and "already exists; use --force" in result.stderr
    result = run("import-hf", src, "--out", tmp_path / "taken", "--force")  # not an earlier output: kept
    assert result.exit_code == 2 and "is not a model folder" in result.stderr
    assert (tmp_path / "taken" / "x").read_text() == "x"
    assert run("import-hf", src, "--out", tmp_path / "earlier").exit_code == 0
    assert run("import-hf", src, "--out", tmp_path / "earlier", "--force").exit_code == 0

    scaled = tmp_path / "scaled"
    scaled.mkdir()
    config = json.loads((hf_folder(tmp_path / "llama", "llama") / "config.json").read_text())
    (scaled / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "llama3", "factor": 8}}))
    result = run("import-hf", scaled, "--out", tmp_path / "never")
    assert result.exit_code == 2 and "rope_scaling.rope_type='llama3'" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "never").exists()


def test_import_of_a_tfkit_checkpoint_names_the_folder_and_says_what_it_is(tmp_path):
    from tfkit.checkpoints.weights import save_model
    from tfkit.models import ModelConfig, build_model

    save_model(build_model(ModelConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)),
               tmp_path / "ckpt")
    result = run("import-hf", tmp_path / "ckpt", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.startswith(f"error: {tmp_path / 'ckpt' / 'config.json'}: this is already a tfkit checkpoint")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_bare_llama_import_warns_about_the_initialised_head(tmp_path):
    src = tmp_path / "hf"
    torch.manual_seed(0)
    transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=64)).save_pretrained(src)
    result = run("import-hf", src, "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    assert "warning: LlamaModel has no LM head: lm_head.weight initialised" in result.stderr
    assert "imported LlamaModel as gpt" in result.stderr


def test_import_force_never_replaces_a_huggingface_source_model(tmp_path):
    src, other = hf_folder(tmp_path / "gpt2", "gpt2"), hf_folder(tmp_path / "llama", "llama")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    result = run("import-hf", src, "--out", other, "--force")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "exists and is a HuggingFace model folder that tfkit export-hf did not write" in result.stderr
    assert "so it is kept" in result.stderr
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before


def test_export_force_replaces_only_an_earlier_export(tmp_path):
    """export-hf --force replaces its own earlier output, never a tfkit checkpoint (a converted model, a
    training checkpoint) nor a HuggingFace model that transformers saved."""
    from tfkit.checkpoints.weights import save_model
    from tfkit.models import ModelConfig, build_model

    save_model(build_model(ModelConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)),
               tmp_path / "gpt")
    assert run("export-hf", tmp_path / "gpt", "--out", tmp_path / "hf").exit_code == 0
    assert run("export-hf", tmp_path / "gpt", "--out", tmp_path / "hf", "--force").exit_code == 0
    shutil.copytree(tmp_path / "gpt", tmp_path / "converted")
    shutil.copytree(tmp_path / "gpt", tmp_path / "trained")
    (tmp_path / "trained" / "trainer_state.pt").write_bytes(b"optimizer state")
    transformers_saved = hf_folder(tmp_path / "downloaded", "gpt2")
    for target, what in ((tmp_path / "converted", "a tfkit model folder"),
                         (tmp_path / "trained", "a training checkpoint"),
                         (transformers_saved, "a HuggingFace model folder that tfkit export-hf did not write")):
        before = {p.name: p.read_bytes() for p in target.iterdir()}
        result = run("export-hf", tmp_path / "gpt", "--out", target, "--force")
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert f"exists and is {what}" in result.stderr
        assert "--force replaces only a HuggingFace folder written by tfkit export-hf" in result.stderr
        assert {p.name: p.read_bytes() for p in target.iterdir()} == before


def test_export_exit_codes(tmp_path):
    from tfkit.checkpoints.weights import save_model
    from tfkit.models import ModelConfig, build_model

    base = dict(vocab_size=300, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    save_model(build_model(ModelConfig(arch="gpt", **base)), tmp_path / "gpt")
    result = run("export-hf", tmp_path / "gpt", "--out", tmp_path / "hf")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "hf") and "as GPT2LMHeadModel" in result.stderr
    assert "warning:" in result.stderr and "no tokenizer" in result.stderr
    save_model(build_model(ModelConfig(arch="gpt", positions="alibi", **base)), tmp_path / "alibi")
    result = run("export-hf", tmp_path / "alibi", "--out", tmp_path / "hf2")
    assert result.exit_code == 2
    assert "model.positions=alibi has no HuggingFace equivalent for gpt" in result.stderr


def test_imported_llama_converts_to_mqa_evaluates_and_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "valid.txt"
    data.write_text("\n".join(HF_TEXT * 3))
    assert run("import-hf", hf_folder(tmp_path / "hf", "llama", tokenizer=True), "--out", tmp_path / "gqa").exit_code == 0
    result = run("convert-mqa-to-gqa", tmp_path / "gqa", "--kv-heads", "1", "--out", tmp_path / "mqa")
    assert result.exit_code == 0, result.output
    result = run("eval", tmp_path / "gqa", tmp_path / "mqa", "--data", data, "--json", tmp_path / "eval.json",
                 "--batch-size", "2", "--max-tokens", "200", "--device", "cpu")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "eval.json").read_text())
    assert [r["kv_cache_bytes_per_token"] for r in rows][0] == 2 * rows[1]["kv_cache_bytes_per_token"]
    assert all(r["loss"] == r["loss"] and r["loss"] > 0 for r in rows)  # finite, not NaN

    assert run("export-hf", tmp_path / "mqa", "--out", tmp_path / "mqa-hf").exit_code == 0
    from tfkit.checkpoints.weights import load_model

    ours, _ = load_model(tmp_path / "mqa")
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mqa-hf", output_loading_info=True)
    assert hf.config.num_key_value_heads == 1 and not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf.eval()(IDS).logits, atol=1e-5, rtol=0)


def test_imported_bert_evaluates(tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    from tfkit.tokenization.train import TokenizerSpec, train_tokenizer

    src = hf_folder(tmp_path / "hf", "bert")
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=120, min_frequency=1), HF_TEXT, tmp_path / "tok",
                    show_progress=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tmp_path / "tok" / name, src / name)
    data = tmp_path / "valid.txt"
    data.write_text("\n".join(HF_TEXT * 3))
    assert run("import-hf", src, "--out", tmp_path / "bert").exit_code == 0
    result = run("eval", tmp_path / "bert", "--data", data, "--batch-size", "2", "--max-tokens", "100",
                 "--device", "cpu", "--seq-len", "32")
    assert result.exit_code == 0, result.output
    assert "bert" in result.stdout


def llama_with_bos(folder: Path) -> Path:
    """A Llama whose tokenizer starts every text with `<s>` (id 1) and ends documents with `</s>` (id 2),
    as Llama and Mistral tokenizers do, unlike GPT-2's one `<|endoftext|>`."""
    from tokenizers import processors

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(HF_TEXT, trainers.BpeTrainer(vocab_size=290, special_tokens=["<unk>", "<s>", "</s>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(folder)
    return folder


def test_imported_llama_frames_documents_and_prompts_with_its_bos(tmp_path, monkeypatch):
    """transformers scores a Llama document as `<s> doc </s>` and continues `<s> prompt`; tfkit's eval
    and generate must frame them the same way, not as `</s> doc` (what a GPT-2-style stream gives)."""
    from tfkit.models.framing import frame_prompt
    from tfkit.tokenization.train import load_tokenizer

    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    src = llama_with_bos(tmp_path / "hf")
    assert run("import-hf", src, "--out", tmp_path / "llama").exit_code == 0
    tok = load_tokenizer(tmp_path / "llama")
    assert tok.doc_start_id == 1 and tok.separator_id == 2
    assert frame_prompt(tok, "The quick", "gpt")[0] == [1, *tok.encode("The quick")]

    docs = HF_TEXT[:3]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    result = run("eval", tmp_path / "llama", "--data", data, "--stride", "32", "--seq-len", "32",
                 "--batch-size", "1", "--device", "cpu", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    nll, count = 0.0, 0
    for doc in docs:
        ids = torch.tensor([[1, *tok.encode(doc), 2]])  # (1, T): what transformers' tokenizer + EOS give
        with torch.no_grad():
            logits = hf(ids).logits[0, :-1]  # (T-1, V): predicts tokens 1..T-1
        nll += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    row = json.loads((tmp_path / "r.json").read_text())[0]
    assert row["tokens"] == count
    assert row["loss"] == pytest.approx(nll / count, rel=1e-5)
