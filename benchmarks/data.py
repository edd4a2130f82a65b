"""Data-stage throughput on the embedded corpus, and tokenization against raw `tokenizers`.

(1) The corpus pipeline of `build_data` — list, sample, read with licences, detect/clean/filter/redact, exact and
near dedup, decontaminate, train the tokenizer, pack — on `--max-files` files of the standard library and the
installed packages, in the same run once on one core (one worker, every thread pool sized to one) and once with one
worker per core, each in a fresh process: MB of source read per second per core, and the speed-up as a fraction of
linear (both runs must keep the same documents and tokens). The instruction and preference steps are timed too, but
reported apart (their cost depends on how many functions have docstrings and doctests, not on bytes).
(2) Tokenization: `benchmarks/tokenization.py` measures `pack_shards` against `Tokenizer.encode_batch_fast`."""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

from codellm_nb.core import get_preset
from codellm_nb.data import build_data
from codellm_nb.measure import save_result

def corpus_run(max_files, workers) -> dict:
    "The data stage on `max_files` files with `workers` processes (run where only `workers` cores are visible)."
    cfg = get_preset("tiny", max_files=max_files, data_workers=workers, vocab_size=16384, pref_pairs=50)
    with tempfile.TemporaryDirectory() as run:
        t0 = time.perf_counter(); stats = build_data(run, cfg); wall = time.perf_counter() - t0
        times = json.loads((Path(run) / "data" / "manifest.json").read_text())["timings"]
    corpus_s = sum(v for k, v in times.items() if k not in ("sft", "prefs"))
    mb = stats["bytes_read"] / 2**20
    return dict(workers=workers, mb_read=round(mb, 1), documents=stats["counts"]["kept"], timings=times,
                corpus_s=round(corpus_s, 1), mb_per_s=round(mb / corpus_s, 3), mb_per_s_per_core=round(mb / corpus_s / workers, 3),
                wall_s=round(wall, 1), train_tokens=stats["train_tokens"], sft_records=stats["sft_records"],
                pref_pairs=stats["pref_pairs"])

def on_cores(max_files, workers) -> dict:
    "`corpus_run` in a fresh process pinned to the first `workers` cores, its threads (torch, tokenizers) sized to match."
    cpus = sorted(os.sched_getaffinity(0))[:workers]
    env = dict(os.environ, OMP_NUM_THREADS=str(workers), RAYON_NUM_THREADS=str(workers))
    out = subprocess.run([sys.executable, __file__, "--max-files", str(max_files), "--only", str(workers)], env=env,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus), stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-files", type=int, default=6000); ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--only", type=int, default=0, help=argparse.SUPPRESS)  # internal: one run, its figures on stdout
    args = ap.parse_args()
    if args.only: return print(json.dumps(corpus_run(args.max_files, args.only)))
    cores = args.workers or len(os.sched_getaffinity(0))
    one, many = on_cores(args.max_files, 1), on_cores(args.max_files, cores)
    if (one["documents"], one["train_tokens"]) != (many["documents"], many["train_tokens"]):
        raise SystemExit(f"1 and {cores} workers disagree: {one['documents']} vs {many['documents']} documents, "
                         f"{one['train_tokens']} vs {many['train_tokens']} tokens")
    scaling = round(many["mb_per_s"] / (cores * one["mb_per_s"]), 3)
    res = dict(files=args.max_files, cores=cores, one_worker=one, all_workers=many, scaling=scaling)
    res["headline"] = dict(metric=f"data stage corpus pipeline ({args.max_files:,} files), speed-up from 1 core to {cores} "
                                  f"as a fraction of linear ({one['mb_per_s_per_core']} vs {many['mb_per_s_per_core']} MB/s per core)",
                           value=scaling, target=">= 0.8")
    print("| step | 1 core (s) | " + f"{cores} cores (s) |\n|---|---|---|")
    for k in one["timings"]: print(f"| {k} | {one['timings'][k]:.1f} | {many['timings'].get(k, float('nan')):.1f} |")
    print(f"corpus pipeline: {one['mb_read']} MB; 1 core {one['mb_per_s_per_core']} MB/s, {cores} cores "
          f"{many['mb_per_s_per_core']} MB/s per core: {scaling} of linear")
    save_result(Path(__file__).parent / "results" / "data.json", res)

if __name__ == "__main__": main()
