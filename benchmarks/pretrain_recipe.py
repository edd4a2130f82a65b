"""Held-out bits per byte after equal wall time: the project's pretraining recipe against a nanoGPT-style baseline,
each with the same tuning budget.

Held equal: the data (the preset's shards, read in the same order — shuffled epochs without replacement, the same
blocks in every optimizer step), the tokenizer, the cores, the precision (bf16 where the CPU has it), the parameter
count (within 5%), the learning-rate grid swept for both, and the wall-clock budget at each learning rate.
- ours: `codellm pretrain` — Llama (RMSNorm, RoPE, SwiGLU), DeepSpeed ZeRO-3 on 2 ranks, AdamW (0.9, 0.95) without
  decay on norms, linear warm-up then cosine to lr/10 over its steps. Its training time sets the budget.
- baseline: nanoGPT's recipe — GPT-2 blocks (LayerNorm, learned positions, GELU MLP of 4x width, tied embeddings),
  as wide as it takes to match our parameter count, one process with all cores, AdamW (0.9, 0.99) with decay on
  matrices only, bf16 autocast where ours trains in bf16, and a schedule driven by the *fraction of the budget
  elapsed* (the same warm-up fraction, then cosine to lr/10), trained until the budget runs out.
Both are scored by `codellm_nb.measure.heldout_metrics` on the same validation tokens; the headline compares each
recipe at its best learning rate."""
import argparse, contextlib, math, tempfile, time
from pathlib import Path
import torch

from codellm_nb.core import get_preset, parse_overrides, resolve_precision, set_threads
from codellm_nb.data import build_data
from codellm_nb.measure import heldout_metrics, save_result
from codellm_nb.tokenizer import TokenLoader, load_tokens

def gpt2_config(cfg, tok, target_params):
    "The GPT-2 config (our depth and heads, 4x MLP) whose width gives the parameter count closest to `target_params`."
    from transformers import GPT2Config, GPT2LMHeadModel
    best = None
    for width in range(cfg.n_heads * 8, 4 * cfg.hidden + 1, cfg.n_heads):
        c = GPT2Config(vocab_size=len(tok), n_positions=cfg.seq_len, n_embd=width, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
        with torch.device("meta"): n = sum(p.numel() for p in GPT2LMHeadModel(c).parameters())
        if best is None or abs(n - target_params) < abs(best[1] - target_params): best = (c, n)
    return best

def nanogpt_baseline(run, cfg, gcfg, lr, budget_s, threads, bf16):
    "Train the GPT-2 baseline at `lr` for `budget_s` seconds of wall time; returns (model, steps)."
    from transformers import GPT2LMHeadModel
    set_threads(threads); torch.manual_seed(cfg.seed)
    model = GPT2LMHeadModel(gcfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.99))
    warm, floor = cfg.warmup / cfg.steps, lr * cfg.min_lr_frac  # the same warm-up fraction as ours
    loader = TokenLoader(load_tokens(Path(run) / "data", "train"), cfg.seq_len, cfg.batch_seqs, seed=cfg.seed)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    step, t0 = 0, time.perf_counter()
    while (frac := (time.perf_counter() - t0) / budget_s) < 1:
        cur = lr * max(frac, 1e-3) / warm if frac < warm else floor + 0.5 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm))) * (lr - floor)
        for g in opt.param_groups: g["lr"] = cur
        x = next(loader)
        with amp: loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step(); opt.zero_grad(set_to_none=True); step += 1
    loader.close()
    return model.eval(), step

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny"); ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lrs", default="5e-4,1e-3,3e-3,6e-3,1.2e-2", help="learning rates swept for both recipes")
    ap.add_argument("--set", nargs="*", default=[], help="preset overrides for both, key=value")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codellm_nb.pretrain import launch_pretrain
    base_ov = dict(eval_every="0", ckpt_every="0", **parse_overrides(args.set))
    cfg = get_preset(args.preset, **base_ov)
    bf16 = resolve_precision(cfg.precision) == "bf16"
    rows = []
    with tempfile.TemporaryDirectory() as run:
        build_data(run, get_preset(args.preset))
        tok = AutoTokenizer.from_pretrained(Path(run) / "data" / "tokenizer")
        val = load_tokens(Path(run) / "data", "val")
        score = lambda m: heldout_metrics(m.float(), val, cfg.seq_len, tok)
        for lr in map(float, args.lrs.split(",")):
            ov = dict(base_ov, lr=str(lr))
            ours = launch_pretrain(run, get_preset(args.preset, **ov), echo=lambda *a: None)
            budget = ours["wall_s"]
            set_threads(args.threads)
            m = score(AutoModelForCausalLM.from_pretrained(Path(run) / "pretrain" / "hf").eval())
            rows.append(dict(recipe="ours", lr=lr, params=ours["params"], steps=cfg.steps, budget_s=budget,
                             loss=round(m["loss"], 4), bits_per_byte=round(m["bits_per_byte"], 4)))
            gcfg, n = gpt2_config(cfg, tok, ours["params"])
            model, steps = nanogpt_baseline(run, cfg, gcfg, lr, budget, args.threads, bf16)
            m = score(model)
            rows.append(dict(recipe="baseline", lr=lr, params=n, width=gcfg.n_embd, steps=steps, budget_s=budget,
                             loss=round(m["loss"], 4), bits_per_byte=round(m["bits_per_byte"], 4)))
            print(rows[-2], rows[-1], flush=True)
    best = {r: min((x for x in rows if x["recipe"] == r), key=lambda x: x["bits_per_byte"]) for r in ("ours", "baseline")}
    res = dict(preset=args.preset, precision="bf16" if bf16 else "fp32", lrs=args.lrs, runs=rows, best=best,
               params_ratio=round(best["baseline"]["params"] / best["ours"]["params"], 3),
               bpb_ratio=round(best["ours"]["bits_per_byte"] / best["baseline"]["bits_per_byte"], 3))
    res["headline"] = dict(metric=f"held-out bits/byte at equal wall time, ours / nanoGPT-style, best of lr {args.lrs} each "
                                  f"({best['ours']['bits_per_byte']} vs {best['baseline']['bits_per_byte']})",
                           value=res["bpb_ratio"], target="< 1")
    print("| recipe | lr | params | steps | budget (s) | val loss | bits/byte |\n|---|---|---|---|---|---|---|")
    for r in rows: print(f"| {r['recipe']} | {r['lr']:g} | {r['params']:,} | {r['steps']} | {r['budget_s']} | {r['loss']} | {r['bits_per_byte']} |")
    print(f"best vs best: bits-per-byte ratio ours/baseline {res['bpb_ratio']} (lower is better); "
          f"parameters baseline/ours {res['params_ratio']}")
    save_result(Path(__file__).parent / "results" / f"pretrain_recipe_{args.preset}.json", res)

if __name__ == "__main__": main()
