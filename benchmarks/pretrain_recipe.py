"""Held-out bits per byte after equal wall time: the project's pretraining recipe against a nanoGPT-style baseline.

Same data (the tiny preset's shards), same tokenizer, same hardware and cores, same wall-clock budget.
- ours: `codellm pretrain` — Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention), DeepSpeed ZeRO-3 on 2 ranks,
  bf16 where the CPU supports it, AdamW without decay on norms, warm-up + cosine; its training wall time sets the budget.
- baseline: the recipe of nanoGPT's small-model configs — a GPT-2 block (LayerNorm, learned positions, GELU MLP,
  tied embeddings) of about the same size, one process with all cores, AdamW lr 1e-3 (beta2 0.99), warm-up + cosine to
  lr/10 over the steps the budget allows (estimated from its first steps), fp32 — trained until the budget runs out.
Both are then scored with the same `heldout_metrics` on the same validation tokens."""
import argparse, json, math, os, tempfile, time
from pathlib import Path
import numpy as np, torch

from codellm_nb.core import get_preset, parse_overrides, set_threads
from codellm_nb.data import build_data, heldout_metrics, load_tokens

def nanogpt_baseline(run, cfg, budget_s, threads):
    "Train a GPT-2-style model for `budget_s` seconds of wall time; returns (model, steps)."
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    set_threads(threads); torch.manual_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(Path(run) / "data" / "tokenizer")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=cfg.seq_len, n_embd=cfg.hidden, n_layer=cfg.n_layers,
                                       n_head=cfg.n_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    lr, min_lr, warmup = 1e-3, 1e-4, 10
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.99))
    data = load_tokens(Path(run) / "data", "train"); n_blocks = len(data) // cfg.seq_len
    rng, total, step, t0 = np.random.default_rng(cfg.seed), None, 0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s:
        if step == 5: total = max(step + 1, int(budget_s / ((time.perf_counter() - t0) / 5)))  # steps the budget allows
        it, n = step, total or 10**9
        cur = lr * (it + 1) / warmup if it < warmup else min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, (it - warmup) / max(1, n - warmup)))) * (lr - min_lr)
        for g in opt.param_groups: g["lr"] = cur
        idx = rng.integers(0, n_blocks, cfg.batch_seqs)
        x = torch.from_numpy(np.stack([data[b * cfg.seq_len:(b + 1) * cfg.seq_len] for b in idx]).astype(np.int64))
        model(input_ids=x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True); step += 1
    return model.eval(), step

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny"); ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], help="preset overrides for our run, key=value")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codellm_nb.pretrain import launch_pretrain
    ov = dict(eval_every="0", ckpt_every="0", **parse_overrides(args.set))
    cfg = get_preset(args.preset, **ov)
    with tempfile.TemporaryDirectory() as run:
        build_data(run, get_preset(args.preset))
        ours = launch_pretrain(run, cfg, ov, echo=lambda *a: None)
        budget = ours["wall_s"]
        tok = AutoTokenizer.from_pretrained(Path(run) / "data" / "tokenizer")
        val = load_tokens(Path(run) / "data", "val")
        set_threads(args.threads)
        m_ours = AutoModelForCausalLM.from_pretrained(Path(run) / "pretrain" / "hf").eval()
        base, base_steps = nanogpt_baseline(run, cfg, budget, args.threads)
        score = lambda m: heldout_metrics(m, val, tok, cfg.seq_len, max_blocks=128)
        res = dict(preset=args.preset, budget_s=budget, ours=dict(steps=cfg.steps, params=ours["params"], **score(m_ours)),
                   baseline=dict(steps=base_steps, params=sum(p.numel() for p in base.parameters()), **score(base)))
    res["bpb_ratio"] = round(res["ours"]["bits_per_byte"] / res["baseline"]["bits_per_byte"], 3)
    print(f"equal wall time: {budget:.1f} s of training each\n| recipe | params | steps | val loss | bits/byte |\n|---|---|---|---|---|")
    for k, name in (("ours", "codellm_nb (Llama, ZeRO-3 x2)"), ("baseline", "nanoGPT-style (GPT-2 block, 1 process)")):
        r = res[k]; print(f"| {name} | {r['params']:,} | {r['steps']} | {r['loss']} | {r['bits_per_byte']} |")
    print(f"bits-per-byte ratio ours/baseline {res['bpb_ratio']} (lower is better)")
    Path(__file__).parent.joinpath("results").mkdir(exist_ok=True)
    Path(__file__).parent.joinpath("results", f"pretrain_recipe_{args.preset}.json").write_text(json.dumps(res, indent=2))

if __name__ == "__main__": main()
