"""Tokenization throughput of the project's packing path against the bare Rust tokenizer, on the same texts.

The corpus is the whole standard library (every `.py` file outside test suites, up to 1 MB each), as documents. One
code-aware BPE tokenizer (trained on a sample of it) tokenizes them in three ways, alternating, `--repeats` times:

- `encode_batch`: `tokenizers.Tokenizer.encode_batch` on the list of texts, ids read out of each encoding (the
  least any user of the ids must do);
- `encode_batch_fast`: the same without computing character offsets;
(both with the Rust tokenizer's own threads on all cores, its fastest setting, unless TOKENIZERS_PARALLELISM says otherwise)
- `pack_shards` with `num_proc` 1 and 2: the whole packing path (`datasets.map`, Arrow, the window, the split, the
  memory-mapped files, `index.json`) into a fresh folder each time, window open so every document is kept.

The figure is the ratio of median throughputs against the *fastest* raw call, `encode_batch_fast` — the one
`pack_shards` itself makes, so the ratio is the cost of everything around the tokenizer; target >= 0.8. The ratio to
`encode_batch` is printed too."""
import os
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # the raw calls' fastest setting: all cores (Rayon threads)
import argparse, statistics, sysconfig, tempfile, time
from pathlib import Path

from datasets import Dataset, disable_progress_bars
from codellm_nb.dedup import collect_documents
from codellm_nb.sources import stdlib_files
from codellm_nb.measure import save_result
from codellm_nb.tokenizer import pack_shards, train_tokenizer

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=16384); ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-files", type=int, default=0, help="0: the whole standard library")
    args = ap.parse_args()
    disable_progress_bars()
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, counts = collect_documents(stdlib_files(args.max_files), root=root, max_bytes=1_000_000)
    texts = [d["text"] for d in docs]
    n_bytes = sum(len(t.encode()) for t in texts)
    tok = train_tokenizer(texts[:300], args.vocab)
    bt = tok.backend_tokenizer
    ds = Dataset.from_list(docs)
    n_tokens = sum(len(e) for e in bt.encode_batch_fast(texts, add_special_tokens=False))  # also warms up
    runs = {"encode_batch": [], "encode_batch_fast": [], "pack_shards num_proc=1": [], "pack_shards num_proc=2": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):
            t0 = time.perf_counter(); ids = [e.ids for e in bt.encode_batch(texts, add_special_tokens=False)]
            runs["encode_batch"].append(time.perf_counter() - t0)
            assert sum(map(len, ids)) == n_tokens; del ids
            t0 = time.perf_counter(); ids = [e.ids for e in bt.encode_batch_fast(texts, add_special_tokens=False)]
            runs["encode_batch_fast"].append(time.perf_counter() - t0); del ids
            for n in (1, 2):
                t0 = time.perf_counter()
                index = pack_shards(ds, tok, Path(d) / f"r{r}n{n}", val_frac=0.05, num_proc=n, min_tokens=0, max_tokens=None)
                runs[f"pack_shards num_proc={n}"].append(time.perf_counter() - t0)
                assert index["train"]["tokens"] + index["val"]["tokens"] == n_tokens + 2 * len(texts)
    res = {k: dict(seconds=round(statistics.median(v), 3), mb_per_s=round(n_bytes / statistics.median(v) / 1e6, 2),
                   tokens_per_s=round(n_tokens / statistics.median(v))) for k, v in runs.items()}
    for v in res.values():
        v["ratio"] = round(v["mb_per_s"] / res["encode_batch_fast"]["mb_per_s"], 3)
        v["ratio_vs_encode_batch"] = round(v["mb_per_s"] / res["encode_batch"]["mb_per_s"], 3)
    r1, r2 = res["pack_shards num_proc=1"]["ratio"], res["pack_shards num_proc=2"]["ratio"]
    out = dict(headline=dict(metric=f"tokenization MB/s, pack_shards with num_proc=2 (the data stage on 2 cores) "
                                    f"/ encode_batch_fast on all cores ({r1} with num_proc=1)", value=r2, target=">= 0.8"),
               docs=len(texts), bytes=n_bytes, tokens=n_tokens, vocab=len(tok), repeats=args.repeats, cores=os.cpu_count(),
               tokenizers_parallelism=os.environ.get("TOKENIZERS_PARALLELISM", "default"), results=res)
    print(f"{len(texts)} documents, {n_bytes / 1e6:.1f} MB, {n_tokens:,} tokens, vocab {len(tok)}, {os.cpu_count()} cores, "
          f"median of {args.repeats}")
    print("| path | seconds | MB/s | tokens/s | vs encode_batch_fast | vs encode_batch |\n|---|---|---|---|---|---|")
    for k, v in res.items():
        print(f"| {k} | {v['seconds']} | {v['mb_per_s']} | {v['tokens_per_s']:,} | {v['ratio']} | {v['ratio_vs_encode_batch']} |")
    print("target: pack_shards >= 0.8x encode_batch_fast")
    save_result(Path(__file__).parent / "results" / "tokenization.json", out)

if __name__ == "__main__": main()
