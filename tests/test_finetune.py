"Fine-tuning with TRL on a small random Llama: LoRA, QLoRA and full SFT, packing, the served prompt, and bad bases."
import json, math
from unittest import mock
from types import SimpleNamespace
import pytest, torch
from codellm_nb.core import get_preset, read_manifest
from codellm_nb.finetune import chat_prompt, dpo, encode, finetune, load_base, load_sft
from codellm_nb.pretrain import model_config

FT = dict(ft_steps=4, ft_batch=4, ft_ckpt_every=2, eval_lines=4, ft_max_len=128, mlflow=False, dpo_steps=0)

@pytest.fixture(scope="module")
def base(data_run, tmp_path_factory):
    "A small random Llama with the data run's tokenizer, saved as a Hugging Face folder."
    from transformers import AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(data_run / "data" / "tokenizer")
    torch.manual_seed(0)
    m = LlamaForCausalLM(model_config(get_preset("tiny", hidden=64, ffn=128, n_layers=2), tok))
    d = tmp_path_factory.mktemp("base"); m.save_pretrained(d); tok.save_pretrained(d)
    return d

def run_dir(data_run, tmp_path):
    "A run folder that shares the data run's data stage and has its own fine-tuning stage."
    d = tmp_path / "run"; (d / "data").mkdir(parents=True)
    for f in (data_run / "data").iterdir(): (d / "data" / f.name).symlink_to(f)
    return d

def logits(model, ids): 
    with torch.no_grad(): return model(ids).logits.float()

def test_lora_checkpoints_are_scored_and_the_merged_model_equals_the_adapter(data_run, tmp_path, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    d = run_dir(data_run, tmp_path)
    res = finetune(d, get_preset("tiny", **FT), base=base)
    sel = read_manifest(d, "finetune")["selection"]
    assert [r["step"] for r in sel] == [0, 2, 4] and sum(r["chosen"] for r in sel) == 1
    best = max(sel[1:], key=lambda r: (r["line_edit_sim"], -r["step"]))
    assert best["chosen"] and res["chosen_step"] == best["step"] and res["selected_by"] == "line_edit_sim"
    assert res["bad_lines"] == 0 and res["train_examples"] > 0 and 0 < res["trainable_pct"] < 100
    ids = torch.randint(0, 500, (1, 24))
    merged = AutoModelForCausalLM.from_pretrained(d / "finetune" / "merged", dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), d / "finetune" / "adapter").eval()
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    torch.testing.assert_close(logits(merged, ids), logits(adapted, ids), atol=1e-5, rtol=1e-5)
    assert (logits(merged, ids) - logits(plain, ids)).abs().max() > 1e-4  # training moved the model
    assert list((d / "finetune" / "tensorboard").rglob("events.out.tfevents*"))
    assert len((d / "finetune" / "metrics.jsonl").read_text().splitlines()) >= FT["ft_steps"]

def test_qlora_trains_on_cpu_and_its_adapter_reloads_on_a_4bit_base(data_run, tmp_path, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    d = run_dir(data_run, tmp_path)
    res = finetune(d, get_preset("tiny", **FT, ft_method="qlora"), base=base)
    assert res["method"] == "qlora"
    q_base = load_base(base, "qlora")
    assert q_base.is_loaded_in_4bit
    ids = torch.randint(0, 500, (1, 24))
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    nf4_error = (logits(q_base.eval(), ids) - logits(plain, ids)).abs().max()  # what 4-bit weights alone change
    adapted = PeftModel.from_pretrained(q_base, d / "finetune" / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(d / "finetune" / "merged", dtype=torch.float32).eval()
    lora_b = [p for n, p in adapted.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # LoRA's B starts at zero: training changed it
    assert (logits(adapted, ids) - logits(merged, ids)).abs().max() <= 2 * nf4_error + 1e-4

def test_packed_full_sft_updates_every_layer_and_saves_no_adapter(data_run, tmp_path, base):
    from transformers import AutoModelForCausalLM
    d = run_dir(data_run, tmp_path)
    res = finetune(d, get_preset("tiny", **FT, ft_method="full", ft_packing=True), base=base)
    assert res["train_loss"] > 0
    assert not (d / "finetune" / "adapter").exists()
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    after = AutoModelForCausalLM.from_pretrained(d / "finetune" / "merged").state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in after if k.endswith("mlp.down_proj.weight"))

def test_training_prompt_is_the_served_prompt(data_run, base):
    from transformers import AutoTokenizer
    from codellm_nb.serve import render_chat
    tok = AutoTokenizer.from_pretrained(base)
    served = lambda msgs: render_chat(tok, msgs)  # what the gateway renders
    exs, _ = load_sft(data_run / "data" / "sft.jsonl")
    chats = [e for e in exs if e["kind"] == "chat"][:20]
    for ex in chats:
        e = encode(ex, tok, 4096)
        k = e["completion_mask"].index(1)
        assert e["input_ids"][:k] == tok(served(ex["messages"][:-1]), add_special_tokens=False).input_ids
        assert tok.decode(e["input_ids"][k:]) == ex["messages"][-1]["content"] + "<|end|><|eos|>"
        assert chat_prompt(tok, ex["messages"][:-1]) == served(ex["messages"][:-1])

def test_packed_rows_give_the_loss_of_separate_examples(data_run, base):
    """Packed examples must not attend to each other: the packed loss equals the padded batch's. (Training runs without a KV
    cache, as TRL's trainer does; with one, transformers cannot split the row by its position ids.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    exs, _ = load_sft(data_run / "data" / "sft.jsonl")
    enc = [x for e in exs[:40] if (x := encode(e, tok, 96))][:6]
    enc = [dict(input_ids=e["input_ids"], labels=[t if m else -100 for t, m in zip(e["input_ids"], e["completion_mask"])]) for e in enc]
    packed = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, padding_free=True)(enc)
    padded = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(enc)
    with torch.no_grad():
        lp = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], labels=packed["labels"], use_cache=False).loss
        lq = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], labels=padded["labels"]).loss
        leak = model(input_ids=packed["input_ids"], labels=packed["labels"], use_cache=False).loss  # one long sequence: attention crosses
    torch.testing.assert_close(lp, lq, atol=1e-5, rtol=1e-5)
    assert abs(leak - lq) > 1e-3  # the check can fail: without position ids the loss differs

def test_bad_bases_and_data_stop_with_the_fix(data_run, tmp_path, base):
    from transformers import AutoTokenizer, LlamaForCausalLM
    cfg = get_preset("tiny", **FT)
    d = run_dir(data_run, tmp_path)
    with pytest.raises(FileNotFoundError, match="No base model folder"): finetune(d, cfg, base=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="--base PATH"): finetune(d, cfg)  # no pretrained model in this run
    with pytest.raises(ValueError, match="sized for GPUs"): finetune(d, get_preset("7b-qlora"), base=base)
    with pytest.raises(ValueError, match="GiB is free: use ft_method=qlora"): finetune(d, get_preset("tiny", **{**FT, "ft_batch": 100_000}), base=base)
    from transformers import AutoConfig
    from codellm_nb import finetune as ft
    big = {**FT, "ft_batch": 256, "ft_max_len": 512, "ft_steps": 1, "precision": "fp32"}  # logits large enough to count in GiB;
    # precision pinned: `auto` is bf16 on CPUs with AVX-512 BF16, which halves what the stage estimates
    four = get_preset("tiny", **{**big, "ft_ranks": 4, "ft_zero_stage": 3})
    each = ft.memory_estimate(AutoConfig.from_pretrained(base), four, "fp32", world=4, zero_stage=3, device="cpu")
    alone = ft.memory_estimate(AutoConfig.from_pretrained(base), get_preset("tiny", **big), "fp32", device="cpu")["device_gib"]
    assert each["device_gib"] + each["host_gib"] < alone  # one of four ranks needs less than one process ...
    free = 4 * (each["device_gib"] + each["host_gib"]) / 0.9 * 0.99  # ... but four of them, in one host's memory, do not fit
    with mock.patch.object(ft, "available_gib", lambda device: free):
        with pytest.raises(ValueError, match="GiB is free"): finetune(d, four, base=base)
    tok = AutoTokenizer.from_pretrained(base)
    small = tmp_path / "small"; LlamaForCausalLM(model_config(get_preset("tiny", hidden=64, ffn=128, n_layers=2), vocab_size=len(tok) - 8)).save_pretrained(small)
    tok.save_pretrained(small)
    with pytest.raises(ValueError, match="resize_token_embeddings"): finetune(d, cfg, base=small)
    plain = tmp_path / "no_template"; LlamaForCausalLM.from_pretrained(base).save_pretrained(plain)
    tok.chat_template = None; tok.save_pretrained(plain); (plain / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no chat template"): finetune(d, cfg, base=plain)
    e = tmp_path / "empty"; (e / "data").mkdir(parents=True); (e / "data" / "sft.jsonl").write_text('{"a": 1}\n{broken\n')
    with pytest.raises(ValueError, match="no valid SFT records"): finetune(e, cfg, base=base)
    lines = [json.dumps(dict(messages=[dict(role="user", content="q"), dict(role="assistant", content="a")]))] * 3 + ["{broken", '{"output": 1}',
             json.dumps(dict(messages=[dict(role="user", content="q"), dict(role="assistant", content="a")], task="completion", input=7))]
    (e / "data" / "sft.jsonl").write_text("\n".join(lines) + "\n")
    exs, bad = load_sft(e / "data" / "sft.jsonl")
    assert len(exs) == 4 and len(bad) == 2 and exs[-1]["key"] == "q" and exs[-1]["code"] is None  # odd extra fields: no crash

def test_dpo_starts_at_ln2_and_prefers_the_chosen_answers(data_run, tmp_path, base):
    "With the adapter-disabled model as the reference, policy and reference agree at the first step: the loss is ln 2."
    d = run_dir(data_run, tmp_path)
    (d / "data" / "prefs.jsonl").unlink(missing_ok=True)
    pairs = [dict(instruction="Complete the body.", input=f"def f{i}(x):\n", chosen=f"    return x + {i}\n", rejected="    return\n")
             for i in range(10)]
    (d / "data" / "prefs.jsonl").write_text("\n".join(map(json.dumps, pairs)) + "\n{broken\n")
    res = dpo(d, get_preset("tiny", dpo_steps=8, dpo_lr=1e-2, ft_batch=4, mlflow=False), sft_dir=base)
    assert abs(res["first_loss"] - math.log(2)) < 1e-4
    assert res["bad_lines"] == 1 and res["train_pairs"] + res["heldout_pairs"] == 10 and res["heldout_pairs"] == 2
    assert res["train_loss"] < math.log(2) and res["reward_margin_train"] > 0 and res["reward_accuracy_train"] >= 0.75
    assert (d / "finetune" / "dpo" / "merged" / "config.json").exists()

def test_a_fine_tune_resumes_from_its_checkpoint_to_the_same_weights(data_run, tmp_path, base):
    from safetensors.torch import load_file
    d = run_dir(data_run, tmp_path)
    cfg = get_preset("tiny", **{**FT, "eval_lines": 0})
    finetune(d, cfg, base=base)
    whole = load_file(d / "finetune" / "adapter" / "adapter_model.safetensors")
    import shutil; shutil.rmtree(d / "finetune" / "checkpoints" / "checkpoint-4")  # as if killed between the two checkpoints
    res = finetune(d, cfg, base=base, resume=True)
    assert res["resumed_from"] == 2
    again = load_file(d / "finetune" / "adapter" / "adapter_model.safetensors")
    assert whole.keys() == again.keys()
    for k in whole: torch.testing.assert_close(again[k], whole[k], atol=1e-6, rtol=1e-5)

def test_full_sft_on_two_zero3_ranks_matches_one_rank(data_run, tmp_path, base):
    """`ft_batch` split over two DeepSpeed ZeRO-3 ranks gives the losses and weights of one process with the whole batch. The
    two halves of a batch hold different numbers of answer tokens, so averaging each rank's mean would give another loss:
    the first step's loss is checked against both."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codellm_nb.finetune import schedule, sft_sets
    FS = dict(FT, ft_method="full", eval_lines=0, ft_ckpt_every=4, precision="fp32")
    one, two = run_dir(data_run, tmp_path / "one"), run_dir(data_run, tmp_path / "two")
    a = finetune(one, get_preset("tiny", **FS), base=base)
    b = finetune(two, get_preset("tiny", **FS, ft_ranks=2, ft_zero_stage=3), base=base)
    assert (a["ranks"], a["zero_stage"], b["ranks"], b["zero_stage"]) == (1, None, 2, 3)
    losses = lambda d: [r["loss"] for r in map(json.loads, (d / "finetune" / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    la, lb = losses(one), losses(two)
    assert len(la) == FS["ft_steps"] and lb == pytest.approx(la, rel=1e-5)
    wa, wb = (load_file(d / "finetune" / "merged" / "model.safetensors") for d in (one, two))
    assert wa.keys() == wb.keys()
    for k in wa: torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-4)
    # the first step by hand: rank 0 takes the batch's first half, rank 1 the second
    tok = AutoTokenizer.from_pretrained(base); model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    train, _, _ = sft_sets(one / "data" / "sft.jsonl", tok, get_preset("tiny", **FS))
    sums, counts = [], []
    for _, e in schedule(train, get_preset("tiny", **FS))[:FS["ft_batch"]]:
        ids, mask = torch.tensor([e["input_ids"]]), torch.tensor(e["completion_mask"][1:], dtype=torch.bool)
        with torch.no_grad(): nll = torch.nn.functional.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="none")
        sums.append(nll[mask].sum().item()); counts.append(mask.sum().item())
    half = FS["ft_batch"] // 2
    whole = sum(sums) / sum(counts)
    per_rank = (sum(sums[:half]) / sum(counts[:half]) + sum(sums[half:]) / sum(counts[half:])) / 2
    assert sum(counts[:half]) != sum(counts[half:]) and abs(whole - per_rank) > 10 * 1e-5 * whole  # the two rules differ here
    assert la[0] == pytest.approx(whole, rel=1e-5) and lb[0] == pytest.approx(whole, rel=1e-5)
