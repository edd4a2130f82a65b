"""The README's main command, measured: `codellm pipeline` on a preset (tiny by default), end to end, and what each
stage produced — the figures the README quotes, with the machine they came from.

Run it as a newcomer's `make pipeline` runs (same command, same threads); `--fp32` makes a CPU with bf16 behave as
one without (`CODELLM_CPU_BF16=0` and torch's AVX2 kernels), to see the slower path."""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

from codellm_nb.measure import save_result

def figures(run:Path) -> dict:
    "The headline numbers of each stage's manifest."
    m = {s: json.loads((run / s / "manifest.json").read_text()) for s in ("data", "pretrain", "finetune", "quantize", "serve", "eval")}
    d, p, f = m["data"]["stats"], m["pretrain"]["metrics"], m["finetune"]["metrics"]
    q = {r["model"]: r for r in m["quantize"]["table"]}
    return dict(
        data=dict(files_sampled=d["funnel"]["sampled"], files_listed=d["funnel"]["listed"], documents=d["counts"]["kept"],
                  train_tokens=d["train_tokens"], val_tokens=d["val_tokens"], bytes_per_token=d["bytes_per_token"],
                  languages=d["languages"], sft_records=d["sft_records"], pref_pairs=d["pref_pairs"]),
        pretrain={k: p[k] for k in ("params", "precision", "world_size", "zero_stage", "steps", "tokens_per_s", "val_loss",
                                    "val_bits_per_byte", "wall_s")},
        finetune={k: f[k] for k in ("method", "val_answer_loss_before", "val_answer_loss_after", "line_edit_sim_before",
                                    "line_edit_sim_after", "fim_edit_sim_before", "fim_edit_sim_after", "trainable_pct", "steps")},
        quantize=dict(served=m["quantize"].get("served"), models={n: {k: r.get(k) for k in ("engine", "size_mb", "size_ratio",
                      "ppl_change_pct", "tokens_per_s", "speedup", "ttft_ms")} for n, r in q.items()}),
        serve=m["serve"]["metrics"],
        eval={name: {k: r.get(k) for k in ("problems", "pass@1", "syntax_valid", "official_agreement", "val_bits_per_byte")}
              for name, r in m["eval"]["compared"].items()},
        stage_seconds=json.loads((run / "timings.json").read_text()))

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny"); ap.add_argument("--fp32", action="store_true")
    ap.add_argument("--set", nargs="*", default=[], help="preset overrides, key=value")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    if args.fp32: env.update(CODELLM_CPU_BF16="0", ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / args.preset
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "codellm_nb.cli", "pipeline", "--preset", args.preset, "--run-dir", str(run),
                            *(["--set", *args.set] if args.set else [])], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode: sys.exit(f"the pipeline failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        res = dict(preset=args.preset, overrides=args.set, forced_fp32=args.fp32, wall_s=round(wall, 1), **figures(run))
    res["headline"] = dict(metric=f"`codellm pipeline --preset {args.preset}` end to end, seconds"
                                  f"{' (bf16 disabled)' if args.fp32 else ''}", value=res["wall_s"], target="minutes on 2 cores")
    print(json.dumps(res, indent=2))
    save_result(Path(__file__).parent / "results" / f"pipeline_{args.preset}{'_fp32' if args.fp32 else ''}.json", res)

if __name__ == "__main__": main()
