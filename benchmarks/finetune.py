"""Full SFT, LoRA and QLoRA side by side in one run: speed, memory and what each does to held-out code completion.

Three parts (`--parts`; a part not run keeps its figures from the results file), each run in a fresh process (so its peak memory is its own), `--threads` threads for all:

- **speed and memory** at the `135m` preset's shape (random weights of that shape, the data run's tokenizer):
  `--steps` SFT steps of batch `--batch` x `--max-len` tokens; tokens/s of training (non-padding tokens) and peak
  resident memory of the process, next to `memory_estimate`'s figure for the same configuration;
- **quality** at the data run's own pretrained model (the tiny preset unless the run says otherwise): `--quality-steps`
  SFT steps of each method, then DPO, with the preset's settings; the pretrained, SFT and DPO models scored on the
  held-out split by the evaluation stage's line completion and single-line infilling and by held-out answer loss, and
  by the share of their completions of `--problems` HumanEval prompts that parse (syntax-valid);
- **curriculum** at the same pretrained model: `--quality-steps` LoRA SFT steps over the same examples in three orders
  (shuffled, shortest answers first, shallowest syntax trees first), each scored by held-out answer loss.

The data run needs its data and pretrain stages (`codellm pretrain --run-dir RUN`)."""
import argparse, json, os, resource, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def one(job:dict) -> dict:
    "Fine-tune as `job` says in this process; what it measured, with this process's memory before and at its peak."
    import psutil, torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from codellm_nb.core import get_preset
    from codellm_nb.finetune import finetune
    from codellm_nb.pretrain import model_config
    cfg = get_preset(job["preset"], **job["overrides"])
    base = Path(job["base"])
    if job.get("random_shape"):  # a random model of a preset's shape, with the data run's tokenizer
        tok = AutoTokenizer.from_pretrained(Path(job["run"]) / "data" / "tokenizer")
        torch.manual_seed(0)
        LlamaForCausalLM(model_config(get_preset(job["random_shape"]), tok)).save_pretrained(base); tok.save_pretrained(base)
    d = Path(job["work"]) / "run"; (d / "data").mkdir(parents=True)
    for f in (Path(job["run"]) / "data").iterdir(): (d / "data" / f.name).symlink_to(f.resolve())
    before = psutil.Process().memory_info().rss / 2**20  # the libraries, loaded: what every method pays alike
    m = finetune(d, cfg, base=base)
    m.update(rss_before_mb=round(before, 1), peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    if job.get("syntax_problems"):  # HumanEval completions that parse, for each model of the stage
        from transformers import AutoModelForCausalLM
        from codellm_nb.evaluate import generate_samples, load_problems, syntax_ok
        from codellm_nb.finetune import LocalClient
        problems = load_problems(job["syntax_problems"])
        tok = AutoTokenizer.from_pretrained(base)
        m["syntax_valid"] = {}
        for name, path in (("base", base), ("sft", d / "finetune" / "merged"), ("dpo", d / "finetune" / "dpo" / "merged")):
            if not (Path(path) / "config.json").exists(): continue
            lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            got = generate_samples(LocalClient(lm, tok, cfg.context), name, problems, max_tokens=cfg.max_new_tokens, workers=1)
            m["syntax_valid"][name] = round(sum(syntax_ok(problems[g["task_id"]], g["completion"]) for g in got) / len(got), 4)
        m["stages"] = json.loads((d / "finetune" / "manifest.json").read_text())["stages"]
    return m

def run(job:dict, threads:int) -> dict:
    "`one(job)` in a fresh Python process."
    with tempfile.TemporaryDirectory() as w:
        job = dict(job, work=w, base=job.get("base") or str(Path(w) / "base"))
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), TQDM_DISABLE="1", TOKENIZERS_PARALLELISM="false")
        p = subprocess.run([sys.executable, __file__, "--job", json.dumps(job)], capture_output=True, text=True, env=env)
        if p.returncode: raise RuntimeError(p.stderr[-3000:])
        return json.loads(p.stdout.strip().splitlines()[-1])

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/tiny", help="a data run with its pretrain stage")
    ap.add_argument("--shape", default="135m", help="preset whose model shape the speed part uses")
    ap.add_argument("--steps", type=int, default=8); ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=256); ap.add_argument("--quality-steps", type=int, default=100)
    ap.add_argument("--problems", type=int, default=32, help="HumanEval problems for the syntax-valid rate")
    ap.add_argument("--threads", type=int, default=2); ap.add_argument("--out", default="benchmarks/results/finetune.json")
    ap.add_argument("--parts", nargs="*", default=["speed", "quality", "curriculum"], choices=["speed", "quality", "curriculum"])
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.job: print(json.dumps(one(json.loads(a.job)), default=str)); return
    from codellm_nb.core import get_preset
    from codellm_nb.finetune import memory_estimate
    from codellm_nb.measure import machine_info, md_table, save_result
    from codellm_nb.pretrain import model_config
    from transformers import AutoTokenizer
    methods = ("full", "lora", "qlora")
    common = dict(eval_lines=0, dpo_steps=0, mlflow=False, ft_steps=a.steps, ft_batch=a.batch, ft_max_len=a.max_len, ft_ckpt_every=a.steps)
    tok = AutoTokenizer.from_pretrained(Path(a.run) / "data" / "tokenizer")
    old = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
    speed = [] if "speed" in a.parts else old["speed"]
    for m in methods if "speed" in a.parts else ():
        r = run(dict(preset="tiny", overrides=dict(common, ft_method=m), run=a.run, random_shape=a.shape), a.threads)
        est = memory_estimate(model_config(get_preset(a.shape), tok), get_preset("tiny", **common, ft_method=m), r["precision"], device="cpu")
        speed.append(dict(method=m, trainable_params=r["trainable_params"], tokens_per_s=r["tokens_per_s"],
                          peak_rss_mb=r["peak_rss_mb"], stage_mb=round(r["peak_rss_mb"] - r["rss_before_mb"], 1),
                          estimate_mb=round(1024 * est["device_gib"], 1)))
        print(speed[-1], flush=True)
    pretrained = str(Path(a.run).resolve() / "pretrain" / "hf")
    quality = [] if "quality" in a.parts else old["quality"]
    for m in methods if "quality" in a.parts else ():  # SFT then DPO as the pipeline runs them, each model scored on the same held-out split
        r = run(dict(preset="tiny", overrides=dict(ft_method=m, mlflow=False, ft_steps=a.quality_steps, ft_ckpt_every=a.quality_steps),
                     run=a.run, base=pretrained, syntax_problems=a.problems), a.threads)
        for st in r["stages"]:
            quality.append(dict(method=m, model=st["model"], syntax_valid=r["syntax_valid"].get(st["model"]),
                                **{k: st[k] for k in ("val_answer_loss", "line_em", "line_edit_sim", "fim_em", "fim_edit_sim")}))
            print(quality[-1], flush=True)
    curriculum = dict(old.get("curriculum", {})) if "curriculum" not in a.parts else dict(steps=a.quality_steps, machine=machine_info(), rows=[])
    for order in ("random", "length", "depth") if "curriculum" in a.parts else ():  # the same examples, in another order
        r = run(dict(preset="tiny", overrides=dict(ft_order=order, eval_lines=0, dpo_steps=0, mlflow=False, ft_steps=a.quality_steps,
                                                   ft_ckpt_every=a.quality_steps), run=a.run, base=pretrained), a.threads)
        curriculum["rows"].append(dict(order=order, train_loss=r["train_loss"], val_answer_loss_before=r["val_answer_loss_before"],
                                       val_answer_loss_after=r["val_answer_loss_after"]))
        print(curriculum["rows"][-1], flush=True)
    full = next(r for r in speed if r["method"] == "full")
    for r in speed: r.update(speed_vs_full=round(r["tokens_per_s"] / full["tokens_per_s"], 2), memory_vs_full=round(r["stage_mb"] / full["stage_mb"], 2))
    q, lo = next(r for r in speed if r["method"] == "qlora"), next(r for r in speed if r["method"] == "lora")
    headline = dict(metric=f"fine-tuning memory (peak RSS above the loaded libraries), QLoRA / full SFT at the {a.shape} shape "
                           f"(LoRA {lo['memory_vs_full']}; tokens/s vs full: LoRA {lo['speed_vs_full']}, QLoRA {q['speed_vs_full']})",
                    value=q["memory_vs_full"], target="< 1")
    res = save_result(a.out, dict(headline=headline, shape=a.shape, steps=a.steps, batch=a.batch, max_len=a.max_len, speed=speed,
                                  quality=quality, curriculum=curriculum, run=a.run))
    print(md_table(speed)); print(md_table(quality)); print(md_table(curriculum.get("rows", []))); print(json.dumps(res["machine"]))

if __name__ == "__main__": main()
