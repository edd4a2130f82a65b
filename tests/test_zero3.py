"""ZeRO-3 on two ranks, launched for real: it trains, it matches a single process, its export loads.

Two ranks with micro-batch 4 and accumulation 2 see exactly the sequences one rank with accumulation 4 sees
(`TokenLoader` numbers sequences globally), so in fp32 the two runs must give the same losses: sharding and accumulation change no arithmetic."""
import json, math
import numpy as np, pytest, torch
from conftest import codellm

COMMON = ["steps=6", "warmup=2", "eval_every=3", "precision=fp32", "seq_len=64", "batch_seqs=16", "micro_batch=4",
          "n_layers=2", "hidden=64", "n_heads=4", "n_kv_heads=2", "ffn=128"]

def losses(run):
    return [json.loads(l)["loss"] for l in open(run / "pretrain" / "metrics.jsonl")]

@pytest.fixture(scope="module")
def two_ranks(data_run, tmp_path_factory):
    run = tmp_path_factory.mktemp("zero3")
    for f in ("data",): (run / f).symlink_to(data_run / f)
    r = codellm("pretrain", "--run-dir", run, "--set", *COMMON, "ranks=2", "zero_stage=3")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return run

def test_two_rank_zero3_trains_and_exports(two_ranks):
    m = json.loads((two_ranks / "pretrain" / "manifest.json").read_text())
    assert m["metrics"]["world_size"] == 2 and m["metrics"]["zero_stage"] == 3
    assert m["ds_config"]["gradient_accumulation_steps"] == 2
    assert (two_ranks / "pretrain" / "checkpoints" / "step6").is_dir()
    l = losses(two_ranks)
    assert len(l) == 6 and all(math.isfinite(x) for x in l) and l[-1] < l[0]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(two_ranks / "pretrain" / "tensorboard")); ea.Reload()
    np.testing.assert_allclose([e.value for e in ea.Scalars("pretrain/loss")], l, rtol=1e-5)
    assert len(ea.Scalars("pretrain/val_bpb")) == 2 and len(ea.Scalars("pretrain/mfu")) == 6
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(two_ranks / "pretrain" / "hf")
    tok = AutoTokenizer.from_pretrained(two_ranks / "pretrain" / "hf")
    assert model.config.num_key_value_heads == 2 and model.config.vocab_size == len(tok)
    assert all(torch.isfinite(p).all() for p in model.parameters())

def test_two_ranks_match_one_rank(two_ranks, data_run, tmp_path):
    (tmp_path / "data").symlink_to(data_run / "data")
    r = codellm("pretrain", "--run-dir", tmp_path, "--set", *COMMON, "ranks=1", "zero_stage=3")
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(losses(two_ranks), losses(tmp_path), rtol=2e-4)

def test_indivisible_batch_is_explained(data_run, tmp_path):
    (tmp_path / "data").symlink_to(data_run / "data")
    r = codellm("pretrain", "--run-dir", tmp_path, "--set", *COMMON, "ranks=2", "batch_seqs=12", "micro_batch=4")
    assert r.returncode == 2 and "not divisible" in r.stderr

def test_export_reproduces_the_logged_validation_loss(two_ranks):
    "The exported fp32 model, scored in one process, gives the loss two ZeRO-3 ranks logged, to 1e-5."
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codellm_nb.measure import heldout_metrics
    from codellm_nb.tokenizer import load_tokens
    m = json.loads((two_ranks / "pretrain" / "manifest.json").read_text())["metrics"]
    model = AutoModelForCausalLM.from_pretrained(two_ranks / "pretrain" / "hf", dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(two_ranks / "pretrain" / "hf")
    h = heldout_metrics(model, load_tokens(two_ranks / "data", "val"), 64, tok, bs=3)  # other batches than training's
    assert m["precision"] == "fp32" and abs(h["loss"] - m["val_loss"]) <= 1e-5 * m["val_loss"], (h, m)
    assert abs(h["bits_per_byte"] - m["val_bits_per_byte"]) <= 1e-4 * m["val_bits_per_byte"], (h, m)

def test_too_little_validation_data_fails_before_training(data_run, tmp_path):
    (tmp_path / "data").symlink_to(data_run / "data")
    s = json.loads((data_run / "data" / "stats.json").read_text())
    seq = s["val_tokens"] + 1  # not one validation sequence, while training has plenty
    assert s["train_tokens"] // seq >= 16, s
    r = codellm("pretrain", "--run-dir", tmp_path, "--set", *COMMON, "ranks=2", f"seq_len={seq}", f"context={seq}")
    assert r.returncode == 2 and "validation split has" in r.stderr and "raise val_frac" in r.stderr

def test_offload_and_activation_checkpointing_run(two_ranks, data_run, tmp_path):
    "ZeRO-Offload of the optimizer and activation checkpointing change memory, not the arithmetic."
    (tmp_path / "data").symlink_to(data_run / "data")
    r = codellm("pretrain", "--run-dir", tmp_path, "--set", *COMMON, "ranks=2", "offload_optimizer=true",
                "activation_checkpointing=true")
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "pretrain" / "manifest.json").read_text())
    assert m["ds_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    np.testing.assert_allclose(losses(tmp_path), losses(two_ranks), rtol=2e-4)
