"""Pretraining throughput: the project's DeepSpeed training step against a bare PyTorch loop, side by side.

Same model (the preset's Llama), same micro-batches of the same shards, same precision, one process with the same
threads. Reports median tokens/s of each, their ratio (target >= 0.95) and the project's MFU against the matmul peak
measured in the same run (issue target >= 0.5 on this CPU at a shape that can use it)."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch

from codellm_nb.core import get_preset, set_threads
from codellm_nb.data import build_data
from codellm_nb.measure import save_result
from codellm_nb.tokenizer import TokenLoader, load_tokens

def bare_loop(run_dir, cfg, steps):
    "The textbook loop: forward, backward, clip, AdamW step; tokens/s per step."
    from transformers import AutoTokenizer, LlamaForCausalLM
    from codellm_nb.pretrain import lr_at, model_config, param_groups
    set_threads(cfg.threads_per_rank or int(os.environ.get("OMP_NUM_THREADS", 2)))
    tok = AutoTokenizer.from_pretrained(Path(run_dir) / "data" / "tokenizer")
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM._from_config(model_config(cfg, tok))
    if cfg.precision == "bf16": model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg) / cfg.lr)
    loader = TokenLoader(load_tokens(Path(run_dir) / "data", "train"), cfg.seq_len, cfg.micro_batch, seed=cfg.seed)  # ours reads so too
    rates = []
    for step in range(steps):
        t0 = time.perf_counter()
        for micro in range(cfg.grad_accum):
            x = next(loader)
            (model(input_ids=x, labels=x).loss / cfg.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
        rates.append(cfg.batch_seqs * cfg.seq_len / (time.perf_counter() - t0))
    loader.close()
    return rates

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny"); ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--precision", default="fp32"); ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], help="more preset overrides, key=value")
    ap.add_argument("--bare", default=None, help=argparse.SUPPRESS)  # internal: run the bare loop on this run dir
    args = ap.parse_args()
    from codellm_nb.core import parse_overrides
    ov = dict(ranks="1", zero_stage="0", precision=args.precision, steps=str(args.steps), warmup="2", eval_every="0",
              ckpt_every="0", threads_per_rank=str(args.threads), batch_seqs="8", micro_batch="8", **parse_overrides(args.set))
    cfg = get_preset(args.preset, **ov)
    if args.bare:
        print(json.dumps(bare_loop(args.bare, cfg, args.steps))); return
    from codellm_nb.pretrain import launch_pretrain
    with tempfile.TemporaryDirectory() as run:
        build_data(run, get_preset(args.preset, max_files=200))
        ours = launch_pretrain(run, cfg, echo=lambda *a: None)
        recs = [json.loads(l) for l in open(Path(run) / "pretrain" / "metrics.jsonl")][5:]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        out = subprocess.run([sys.executable, __file__, "--preset", args.preset, "--steps", str(args.steps), "--precision",
                              args.precision, "--threads", str(args.threads), "--set", *args.set, "--bare", run],
                             env=env, capture_output=True, text=True, check=True).stdout
        bare = json.loads(out.strip().splitlines()[-1])[5:]
    res = dict(preset=args.preset, precision=args.precision, threads=args.threads, steps=args.steps,
               ours_tokens_per_s=round(statistics.median(r["tokens_per_s"] for r in recs), 1),
               bare_tokens_per_s=round(statistics.median(bare), 1), mfu=round(statistics.median(r["mfu"] for r in recs), 4),
               peak_tflops=ours["peak_tflops"])
    res["ratio"] = round(res["ours_tokens_per_s"] / res["bare_tokens_per_s"], 3)
    shape = " ".join(args.set) or "the preset's shape"
    res["headline"] = dict(metric=f"training tokens/s, DeepSpeed step / bare PyTorch loop ({args.preset}, {shape}, {args.precision}); "
                                  f"MFU {res['mfu']}", value=res["ratio"], target=">= 0.95")
    print("| loop | median tokens/s |\n|---|---|")
    print(f"| codellm_nb (DeepSpeed engine) | {res['ours_tokens_per_s']} |\n| bare PyTorch | {res['bare_tokens_per_s']} |")
    print(f"ratio {res['ratio']} (target >= 0.95); MFU {res['mfu']} of a measured {res['peak_tflops']} TFLOP/s peak")
    shape = "_".join(a.replace("=", "") for a in args.set)
    save_result(Path(__file__).parent / "results" / f"pretrain_{args.preset}_{args.precision}{'_' + shape if shape else ''}.json",
                dict(res, overrides=args.set))

if __name__ == "__main__": main()
