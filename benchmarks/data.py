"""Data-stage throughput on the embedded corpus: datatrove against the in-memory engine, 1 core against all.

The corpus half of `build_data` — list, sample, read with licences, detect/clean/filter/redact, exact and near dedup,
decontaminate, train the tokenizer, pack — on `--max-files` files of the standard library and the installed
packages, once per engine (`data_engine=datatrove`: tasks on datatrove's local executor; `datasets`: `datasets.map`
with `num_proc` and an in-memory LSH index) and per core count: one worker on one core, then one worker per core,
each in a fresh process pinned to its cores, every thread pool sized to match; `--repeats` rounds, alternating, and
the fastest run of each counts. Reported: MB of source read per second per core, and the speed-up from 1 core to
all as a fraction of linear, for the whole and per step. Every run must keep the same documents and tokens. The
instruction and preference steps are left out: their cost follows how many functions have docstrings and doctests,
not bytes, and they are the same code on both engines.
`benchmarks/tokenization.py` measures `pack_shards` against `Tokenizer.encode_batch_fast`."""
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

from codellm_nb.core import get_preset
from codellm_nb.measure import md_table, save_result

def corpus_run(max_files:int, workers:int, engine:str) -> dict:
    "The corpus steps on `max_files` files with `workers` processes on `engine` (run where only `workers` cores are visible)."
    from datasets import load_from_disk
    from transformers import AutoTokenizer
    from codellm_nb.data import build_documents, pack_on_datatrove
    from codellm_nb.tokenizer import pack_shards, train_tokenizer
    cfg = get_preset("tiny", max_files=max_files, data_workers=workers, vocab_size=16384, data_engine=engine)
    times = {}
    with tempfile.TemporaryDirectory() as run:
        out = Path(run) / "data"; out.mkdir()
        t = time.perf_counter(); stats = build_documents(cfg, out); times["documents"] = time.perf_counter() - t
        t = time.perf_counter()
        train_tokenizer(load_from_disk(str(out / "documents"))["text"], cfg.vocab_size, out / "tokenizer")
        times["tokenizer"] = time.perf_counter() - t
        t = time.perf_counter()
        if engine == "datatrove": index = pack_on_datatrove(cfg, out, "benchmark")
        else: index = pack_shards(load_from_disk(str(out / "documents")), AutoTokenizer.from_pretrained(out / "tokenizer"),
                                  out / "shards", cfg.val_frac, num_proc=workers, min_tokens=cfg.min_tokens, max_tokens=cfg.max_tokens)
        times["pack"] = time.perf_counter() - t
    total, mb = sum(times.values()), stats["bytes_read"] / 2**20
    return dict(engine=engine, workers=workers, mb_read=round(mb, 1), documents=stats["funnel"]["after decontamination"],
                train_tokens=index["train"]["tokens"], timings={k: round(v, 2) for k, v in times.items()},
                seconds=round(total, 1), mb_per_s=round(mb / total, 3), mb_per_s_per_core=round(mb / total / workers, 3))

def on_cores(max_files:int, workers:int, engine:str) -> dict:
    "`corpus_run` in a fresh process pinned to the first `workers` cores, its threads (torch, tokenizers) sized to match."
    cpus = sorted(os.sched_getaffinity(0))[:workers]
    env = dict(os.environ, OMP_NUM_THREADS=str(workers), RAYON_NUM_THREADS=str(workers), TQDM_DISABLE="1")
    out = subprocess.run([sys.executable, __file__, "--max-files", str(max_files), "--only", f"{engine}:{workers}"], env=env,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus), stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-files", type=int, default=6000); ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each engine and core count, alternating; the fastest counts")
    ap.add_argument("--only", default="", help=argparse.SUPPRESS)  # internal: one run, its figures on stdout
    args = ap.parse_args()
    if args.only:
        engine, workers = args.only.split(":")
        return print(json.dumps(corpus_run(args.max_files, int(workers), engine)))
    cores = args.workers or len(os.sched_getaffinity(0))
    tried = {}
    for _ in range(args.repeats):  # alternating, so a slow spell of a shared machine hits every configuration alike
        for e in ("datatrove", "datasets"):
            for w in (1, cores): tried.setdefault((e, w), []).append(on_cores(args.max_files, w, e))
    runs = {k: min(v, key=lambda r: r["seconds"]) for k, v in tried.items()}
    keys = {(r["documents"], r["train_tokens"]) for r in runs.values()}
    if len(keys) != 1: raise SystemExit(f"the runs disagree on (documents, train tokens): {sorted(keys)}")
    of_linear = lambda one, many: round(one / (cores * many), 3)  # seconds on 1 core / (cores x seconds on all)
    engines = {e: dict(one_core=runs[(e, 1)], all_cores=runs[(e, cores)],
                       scaling=round(runs[(e, cores)]["mb_per_s"] / (cores * runs[(e, 1)]["mb_per_s"]), 3),
                       step_scaling={k: of_linear(v, runs[(e, cores)]["timings"][k]) for k, v in runs[(e, 1)]["timings"].items()})
               for e in ("datatrove", "datasets")}
    dt = engines["datatrove"]
    res = dict(files=args.max_files, cores=cores, repeats=args.repeats, engines=engines,
               seconds_of_every_run={f"{e}, {w} core(s)": [r["seconds"] for r in v] for (e, w), v in tried.items()},
               headline=dict(metric=f"data stage corpus pipeline on datatrove ({args.max_files:,} files), speed-up from 1 core to "
                                    f"{cores} as a fraction of linear ({dt['one_core']['mb_per_s_per_core']} vs "
                                    f"{dt['all_cores']['mb_per_s_per_core']} MB/s per core)",
                             value=dt["scaling"], target=">= 0.8, and >= 0.69 MB/s per core"))
    rows = [dict(engine=e, cores=r["workers"], **r["timings"], seconds=r["seconds"], mb_per_s_per_core=r["mb_per_s_per_core"])
            for (e, _), r in runs.items()]
    print(md_table(rows))
    for e, v in engines.items(): print(f"{e}: {v['scaling']} of linear from 1 to {cores} cores; per step {v['step_scaling']}")
    save_result(Path(__file__).parent / "results" / "data.json", res)

if __name__ == "__main__": main()
