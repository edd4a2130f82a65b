"""Quantization: how much smaller, how close and how fast each method is, side by side in one run.

Two models, because no trained `small` model fits in a benchmark's budget on two cores:

- **size and speed at the `small` preset's shape** (`--shape`; random weights, the preset's vocabulary, the tokenizer of
  `--run`): what a model of that size takes on disk and to decode. Each method's folder is written, then measured in a
  process of its own (its peak memory is that process's): greedy decode tokens/s at batch 1 and 8 after a short prompt,
  and time to first token after a 256-token prompt. The full-precision baselines are transformers' fp32 `generate`
  (eager, and under `torch.compile`, the fastest call of the library) and llama.cpp's own f32 GGUF; speedups are over the
  fastest of them. torchao's methods are measured compiled too (eager they are slower still, see 04_quantize), with
  the embedding and output layer included; llama.cpp's `q4_0` keeps the output layer in 8 bits as llama.cpp chooses,
  `q4_0_pure` puts every matrix in 4 bits. Peak memory is each measuring process's resident high-water mark (the Python
  runtime and libraries included, about the same for every row).
- **quality on the trained model of `--run`** (the tiny pipeline's fine-tuned model): held-out perplexity and bits per
  byte of each method's copy, and how often its next-token choice agrees with fp32's on held-out code; and the perplexity
  change on its `outlier_copy` (the same function with a few activation channels 30x larger, as trained LLMs have), where
  calibration has something to do. Calibrated methods (`w8a8_sq`: SmoothQuant; `q4_0_imatrix`: llama.cpp's quantizer
  with an importance matrix) calibrate on the run's calibration split; every method is scored on the held-out tokens
  before it.
- **tasks on the trained model** (`--problems`, 0 to skip): each method's copy served by the gateway (llama.cpp for GGUF,
  transformers for torchao) and evaluated as the evaluation stage does: HumanEval pass@1 and how many verdicts differ
  from fp32's sample by sample, syntax-valid completions, held-out line completion and infilling (edit similarity).
  At the tiny size pass@1 is near zero, so verdict changes say little there; the line scores move.

Targets (from the quantization issue): INT8 >= 3.5x smaller than fp32 for the whole folder at the `small` shape,
<= 1% perplexity increase, >= 1.5x decode speed; INT4/W4A8 >= 6x smaller, <= 3% perplexity increase."""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

TORCHAO = ("int8", "w8a8", "w8a8_sq", "int4", "w4a8")
GGUF = ("f32", "q8_0", "q4_0", "q4_0_pure", "q4_0_imatrix")

def write_folder(src, dst:Path, method:str, calib) -> Path:
    "Method `method`'s copy of model folder `src` (torchao with embeddings and output layer included, or GGUF); calibrated on `calib`."
    import torch
    from transformers import AutoModelForCausalLM
    from codellm_nb.quantize import CALIBRATED, importance_matrix, quantize_model, to_gguf
    if method == "fp32": return Path(src)
    if method in GGUF:
        imp = importance_matrix(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32), calib) if method in CALIBRATED else None
        return to_gguf(src, dst, method, imatrix=imp)
    quantize_model(src, dst, method, embeddings=True, calib=calib if method in CALIBRATED else None); return dst

def measure(folder:str, compiled:bool, threads:int) -> dict:
    "In a child process: decode speeds and time to first token of one folder, and this process's peak memory."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codellm_nb.quantize import gguf_file, gguf_speed, hf_speed
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(folder)
    prompt = tok("<|lang=python|>def fibonacci(n):\n", return_tensors="pt", add_special_tokens=False).input_ids
    g = torch.Generator().manual_seed(0)
    long_ids = torch.randint(0, len(tok), (1, 256), generator=g)
    t0 = time.perf_counter()
    if gguf_file(folder): r = gguf_speed(folder, prompt, long_ids, threads=threads)
    else:
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        if compiled: m.forward = torch.compile(m.forward, dynamic=True)
        r = hf_speed(m, prompt, long_ids)
    # this process's resident high-water mark (ru_maxrss would carry over the parent's, which forked it)
    hwm = next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    return dict(r, measure_s=round(time.perf_counter() - t0, 1), peak_mb=round(hwm / 1024, 1))

def in_child(folder, compiled:bool, threads:int) -> dict:
    code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from quantize import measure; " \
           f"print('RESULT', json.dumps(measure({str(folder)!r}, {compiled}, {threads})))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if p.returncode or line is None: sys.exit(f"measuring {folder} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads(line[7:])

def quality(run:Path, methods, tmp:Path, calib, val, seq:int, outliers:bool=False) -> dict:
    "Held-out perplexity, bits per byte and next-token agreement with fp32 of each method's copy of the run's model (or its outlier copy)."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codellm_nb.measure import heldout_metrics
    from codellm_nb.quantize import GGUFLogits, gguf_file, outlier_copy
    src = run / "finetune" / "merged"
    if outliers: src = outlier_copy(src, tmp / "outliers")
    tok = AutoTokenizer.from_pretrained(src)
    x = torch.tensor(val[:seq * 4].reshape(4, seq).astype("int64"))
    out, ref = {}, None
    for m in methods:
        d = write_folder(src, tmp / f"q-{m}{'-outliers' if outliers else ''}", m, calib)
        lm = GGUFLogits(d, seq) if gguf_file(d) else AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad(): choice = lm(input_ids=x).logits.argmax(-1)
        ref = choice if ref is None else ref
        h = heldout_metrics(lm, val, seq, tok)
        out[m] = dict(val_ppl=round(h["ppl"], 4), val_bpb=round(h["bits_per_byte"], 5),
                      next_token_agreement=round((choice == ref).float().mean().item(), 4))
        if gguf_file(d): lm.close()
    for r in out.values(): r["ppl_change_pct"] = round(100 * (r["val_ppl"] / out["fp32"]["val_ppl"] - 1), 3)
    return out

def task_quality(run:Path, methods, tmp:Path, calib, problems:int) -> dict:
    "Served and evaluated like the evaluation stage: each method's copy of the run's model, scored against fp32's answers."
    import dataclasses
    from codellm_nb.core import Preset
    from codellm_nb.evaluate import evaluate_model, load_problems
    known = {f.name for f in dataclasses.fields(Preset)}
    cfg = Preset(**{k: v for k, v in json.loads((run / "finetune" / "manifest.json").read_text())["config"].items() if k in known})
    cfg = dataclasses.replace(cfg, serve_engine="transformers", serve_replicas=0)  # every HF folder on one engine (GGUF: llama.cpp)
    probs, out, ref = load_problems(problems), {}, None
    for m in methods:
        if m == "f32": continue  # llama.cpp's unquantized copy: the same answers as fp32
        print(f"evaluating {m} ...", flush=True)
        d = write_folder(run / "finetune" / "merged", tmp / f"e-{m}", m, calib)
        res, checked = evaluate_model(d, cfg, probs, run_dir=run, name=m)
        ref = checked if ref is None else ref
        out[m] = {k: res.get(k) for k in ("pass@1", "syntax_valid", "line_edit_sim", "fim_edit_sim")}
        out[m]["verdict_changes"] = sum(a["passed"] != b["passed"] for a, b in zip(checked, ref))
    return out

def plot(rows:list[dict], path:Path, shape:str):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 4.8)); ax = fig.subplots()
    for r in rows:
        c = "tab:green" if r["engine"] == "llama.cpp" else "tab:blue"
        ax.scatter(r["size_ratio"], r["speedup"], s=40, color=c)
        ax.annotate(r["method"], (r["size_ratio"], r["speedup"]), fontsize=8, xytext=(6, -3), textcoords="offset points")
    ax.axhline(1, color="grey", lw=0.8); ax.axvline(1, color="grey", lw=0.8); ax.set_xlim(0.5, max(r["size_ratio"] for r in rows) + 1.2)
    ax.text(0.02, 0.97, "perplexity change:\n" + "\n".join(f"{r['method']}: {r['ppl_change_pct']:+.2f}%" for r in rows), transform=ax.transAxes,
            va="top", fontsize=7, family="monospace", bbox=dict(facecolor="white", alpha=0.8, lw=0))
    ax.set_xlabel("times smaller than fp32 (whole folder)"); ax.set_ylabel("decode speed over the fastest fp32 (batch 1)")
    ax.set_title(f"Quantization at the {shape} shape: blue torchao, green llama.cpp"); fig.tight_layout(); fig.savefig(path, dpi=110)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/nbtest", help="a run with a fine-tuned model (its tokenizer, and the quality part)")
    ap.add_argument("--shape", default="small", help="the preset whose model shape size and speed are measured at")
    ap.add_argument("--threads", type=int, default=1, help="threads per measured process (1: two cores' fastest for one stream)")
    ap.add_argument("--problems", type=int, default=20, help="HumanEval problems per method in the task part (0: skip it)")
    a = ap.parse_args()
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from codellm_nb.core import get_preset
    from codellm_nb.measure import md_table, save_result
    from codellm_nb.pretrain import model_config
    from codellm_nb.quantize import folder_mb
    from codellm_nb.quantize import calibration_split
    run = Path(a.run)
    methods = ("fp32", *TORCHAO, *GGUF)
    cfg = json.loads((run / "finetune" / "manifest.json").read_text())["config"]
    calib, val = calibration_split(run / "data", cfg["seq_len"], cfg.get("quant_calib_samples", 32))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("quality on the trained model and its outlier copy ...", flush=True)
        q = quality(run, methods, tmp, calib, val, cfg["seq_len"])
        for m, r in quality(run, methods, tmp, calib, val, cfg["seq_len"], outliers=True).items():
            q[m]["ppl_change_pct_outliers"] = r["ppl_change_pct"]
        print(f"building the {a.shape} shape ...", flush=True)
        tok = AutoTokenizer.from_pretrained(run / "finetune" / "merged")
        torch.manual_seed(0)
        src = tmp / "shape"
        LlamaForCausalLM(model_config(get_preset(a.shape), tok, vocab_size=get_preset(a.shape).vocab_size)).save_pretrained(src)
        tok.save_pretrained(src)
        rows = []
        for m in methods:
            d = write_folder(src, tmp / m, m, calib)
            for compiled in ((False, True) if m == "fp32" else (True,) if m in TORCHAO else (False,)):
                print(f"measuring {m}{' compiled' if compiled else ''} ...", flush=True)
                r = in_child(d, compiled, a.threads)
                rows.append(dict(method=m + (" (compiled)" if compiled and m == "fp32" else ""), engine="llama.cpp" if m in GGUF else "transformers",
                                 compiled=compiled, size_mb=folder_mb(d), **r, **q[m]))
        tasks = task_quality(run, methods, tmp, calib, a.problems) if a.problems else {}
    for r in rows:
        for k, v in tasks.get(r["method"].removesuffix(" (compiled)"), {}).items(): r[f"task_{k}"] = v
    base = rows[0]["size_mb"]
    fastest = max(r["tokens_per_s"] for r in rows if r["method"].startswith(("fp32", "f32")))
    for r in rows:
        r.update(size_ratio=round(base / r["size_mb"], 2), speedup=round(r["tokens_per_s"] / fastest, 2))
    by = {r["method"]: r for r in rows}
    targets = {
        "int8_best": max((by[m] for m in ("int8", "w8a8", "q8_0")), key=lambda r: r["speedup"])["method"],
        "int4_best": max((by[m] for m in ("int4", "w4a8", "q4_0", "q4_0_pure")), key=lambda r: r["size_ratio"])["method"]}
    i8, i4 = by[targets["int8_best"]], by[targets["int4_best"]]
    targets.update(int8_size=dict(value=i8["size_ratio"], target=">= 3.5", met=i8["size_ratio"] >= 3.5),
                   int8_ppl_pct=dict(value=i8["ppl_change_pct"], target="<= 1", met=i8["ppl_change_pct"] <= 1),
                   int8_speedup=dict(value=i8["speedup"], target=">= 1.5", met=i8["speedup"] >= 1.5),
                   int4_size=dict(value=i4["size_ratio"], target=">= 6", met=i4["size_ratio"] >= 6),
                   int4_ppl_pct=dict(value=i4["ppl_change_pct"], target="<= 3", met=i4["ppl_change_pct"] <= 3))
    cols = ["method", "engine", "size_mb", "size_ratio", "tokens_per_s", "speedup", "tokens_per_s_batch", "ttft_ms", "peak_mb",
            "val_ppl", "ppl_change_pct", "val_bpb", "next_token_agreement", "ppl_change_pct_outliers",
            *(["task_pass@1", "task_verdict_changes", "task_syntax_valid", "task_line_edit_sim", "task_fim_edit_sim"] if tasks else [])]
    print(md_table(rows, cols)); print(json.dumps(targets, indent=2))
    out = Path(__file__).parent / "results"
    plot(rows, out / "quantize.png", a.shape)
    save_result(out / "quantize.json", dict(
        shape=f"the {a.shape} preset's layers and vocabulary, random weights (size, speed, memory)",
        quality_model=f"{run}/finetune/merged (trained, tiny preset), and its outlier_copy for ppl_change_pct_outliers",
        calibration=dict(windows=len(calib), seq_len=cfg["seq_len"], measured_tokens=len(val),
                         split="the last windows of the run's held-out split; quality is scored on the held-out tokens before them"),
        threads=a.threads, task_problems=a.problems, rows=rows, targets=targets,
        headline=dict(metric=f"INT8 ({targets['int8_best']}) at the {a.shape} shape: times smaller, decode speedup over the fastest fp32",
                      value=[i8["size_ratio"], i8["speedup"]], target=">= 3.5x smaller, >= 1.5x faster, <= 1% perplexity")))

if __name__ == "__main__": main()
