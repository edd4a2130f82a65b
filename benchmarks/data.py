"""Data-stage throughput on the embedded corpus, and tokenization against raw `tokenizers`.

(1) The corpus pipeline of `build_data` — list, sample, read with licences, detect/clean/filter/redact, exact and
near dedup, decontaminate, train the tokenizer, pack — on `--max-files` files of the standard library and the
installed packages: MB of source read per second, per core. The instruction and preference steps are timed too, but
reported apart (their cost depends on how many functions have docstrings and doctests, not on bytes).
(2) Tokenization: `benchmarks/tokenization.py` measures `pack_shards` against `Tokenizer.encode_batch` (target >= 0.8x)."""
import argparse, json, os, tempfile, time
from pathlib import Path

from codellm_nb.core import get_preset
from codellm_nb.data import build_data

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-files", type=int, default=6000); ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    cores = args.workers or len(os.sched_getaffinity(0))
    cfg = get_preset("tiny", max_files=args.max_files, data_workers=cores, vocab_size=16384, pref_pairs=50)
    with tempfile.TemporaryDirectory() as run:
        t0 = time.perf_counter(); stats = build_data(run, cfg); wall = time.perf_counter() - t0
        times = json.loads((Path(run) / "data" / "manifest.json").read_text())["timings"]
    corpus_s = sum(v for k, v in times.items() if k not in ("sft", "prefs"))
    mb = stats["bytes_read"] / 2**20
    res = dict(files=args.max_files, cores=cores, mb_read=round(mb, 1), documents=stats["counts"]["kept"], timings=times,
               corpus_s=round(corpus_s, 1), mb_per_s_per_core=round(mb / corpus_s / cores, 2), wall_s=round(wall, 1),
               train_tokens=stats["train_tokens"], sft_records=stats["sft_records"], pref_pairs=stats["pref_pairs"])
    print("| step | seconds |\n|---|---|"); [print(f"| {k} | {v:.1f} |") for k, v in times.items()]
    print(f"corpus pipeline: {mb:.1f} MB read in {corpus_s:.1f} s on {cores} cores = {res['mb_per_s_per_core']} MB/s per core")
    Path(__file__).parent.joinpath("results").mkdir(exist_ok=True)
    Path(__file__).parent.joinpath("results", "data.json").write_text(json.dumps(res, indent=2))

if __name__ == "__main__": main()
