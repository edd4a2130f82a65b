"""Speculative decoding at batch 1: where a draft pays, side by side in one run.

A target model and a draft of the same tokenizer (by default a 91M-parameter target of the `135m` preset's shape and the
`tiny` preset, both pretrained by this project on the same tiny data run), greedy decoding of `--prompts` held-out
windows of the data run's validation tokens, `--max-tokens` each, one request at a time, `--threads` threads for every
contestant. Measured, alternating `--repeats` times and keeping the median:

- `generate`: the target alone with `transformers`' `generate` and its KV cache, the fastest plain call of the library;
- `speculative_rounds` (this project) with the draft as trained, with the draft distilled on the target's outputs
  (`distill_draft`, the distilled copy is cached in `--work`), and with n-gram proposals;
- `transformers` assisted generation (`assistant_model=`, a constant `num_assistant_tokens`) with the distilled draft, and
  its prompt lookup (`prompt_lookup_num_tokens`);
- with `make vllm`: vLLM's own server, plain and with the distilled draft in `--speculative-config`, requests sent one
  at a time (its acceptance read from its metrics).

Every speculative output is checked against the plain greedy output of the same engine. The figures: acceptance (drafts
kept / drafts proposed), tokens per target pass, tokens/s and the speed-up over plain decoding."""
import argparse, os, re, statistics, sys, time, urllib.request
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def held_out_prompts(data_dir, n, length=32, seed=1):
    import numpy as np
    from codellm_nb.tokenizer import load_tokens
    val = load_tokens(data_dir, "val")
    return [val[s:s + length].astype(int).tolist() for s in np.random.default_rng(seed).integers(0, len(val) - length, n)]

def timed(fn, prompts):
    "Run `fn(ids) -> tokens` on every prompt: the outputs, tokens/s."
    t0 = time.perf_counter(); outs = [fn(p) for p in prompts]
    return outs, sum(map(len, outs)) / (time.perf_counter() - t0)

def vllm_rows(target, draft, prompts, max_tokens, k, threads):
    "vLLM's server, plain and speculative, one request at a time: tokens/s, the outputs, and acceptance from its metrics."
    import openai
    from codellm_nb.serve import Replica
    rows = {}
    for name, kw in (("vllm", {}), ("vllm + distilled draft", dict(draft=draft, spec_tokens=k))):
        r = Replica("vllm", target, "bench", 0, threads=threads, **kw); r.spawn()
        try:
            t0 = time.time()
            while True:
                try: urllib.request.urlopen(f"{r.url}/health", timeout=2); break
                except OSError:
                    if not r.alive() or time.time() - t0 > 600: raise RuntimeError(f"vLLM did not start: {r.log.read_text()[-2000:]}")
                    time.sleep(1)
            client = openai.OpenAI(base_url=f"{r.url}/v1", api_key="none", max_retries=0, timeout=600)
            def one(ids):
                c = client.completions.create(model="bench", prompt=ids, max_tokens=max_tokens, temperature=0)
                return c.choices[0].text, c.usage.completion_tokens
            one(prompts[0])  # warm-up
            t0 = time.perf_counter(); got = [one(p) for p in prompts]; dt = time.perf_counter() - t0
            met = urllib.request.urlopen(f"{r.url}/metrics").read().decode()
            def total(m): return sum(float(v) for v in re.findall(rf"^{m}(?:{{[^}}]*}})? ([0-9.e+]+)$", met, re.M))
            acc, prop = total("vllm:spec_decode_num_accepted_tokens_total"), total("vllm:spec_decode_num_draft_tokens_total")
            rows[name] = dict(texts=[t for t, _ in got], tokens_per_s=sum(m for _, m in got) / dt, acceptance=acc / prop if prop else None)
        finally: r.stop()
    return rows

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="runs/spec-target/pretrain/hf"); ap.add_argument("--draft", default="runs/spec-draft/pretrain/hf")
    ap.add_argument("--data", default="runs/spec-target/data", help="the data run both were trained on")
    ap.add_argument("--work", default="runs/spec-work"); ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128); ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--distill-steps", type=int, default=300); ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2); ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/speculative.json")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    from transformers import AutoModelForCausalLM
    from codellm_nb.serve import distill_draft, load_tokenizer, speculative_rounds
    from codellm_nb.tokenizer import load_tokens
    torch.set_num_threads(a.threads)
    load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    tok, target, draft = load_tokenizer(a.target), load(a.target), load(a.draft)
    distilled_dir = Path(a.work) / f"distilled-{a.distill_steps}"
    if not (distilled_dir / "config.json").exists():
        t0 = time.perf_counter()
        distill_draft(target, load(a.draft), load_tokens(a.data, "train"), Path(a.work) / "trainer", steps=a.distill_steps).save_pretrained(distilled_dir)
        tok.save_pretrained(distilled_dir)
        (distilled_dir / "distill_s.txt").write_text(f"{time.perf_counter() - t0:.0f}")
    distilled = load(distilled_dir)
    prompts, n, k, eos = held_out_prompts(a.data, a.prompts), a.max_tokens, a.k, tok.eos_token_id
    params = lambda m: sum(p.numel() for p in m.parameters())

    def plain(ids, **kw):
        x = torch.tensor([ids])
        with torch.no_grad():
            return target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                   pad_token_id=tok.pad_token_id, **kw)[0, len(ids):].tolist()
    stats = {}
    def ours(d):
        def go(ids):
            st = stats.setdefault(d if isinstance(d, str) else id(d), {})
            with torch.no_grad(): return [t for new in speculative_rounds(target, d, ids, n, k, eos, st) for t in new]
        return go
    distilled.generation_config.num_assistant_tokens, distilled.generation_config.num_assistant_tokens_schedule = k, "constant"
    runs = {"generate (target alone)": plain, "speculative_rounds, draft as trained": ours(draft),
            "speculative_rounds, distilled draft": ours(distilled), "speculative_rounds, n-gram": ours("ngram"),
            "transformers assisted, distilled draft": lambda ids: plain(ids, assistant_model=distilled),
            "transformers prompt lookup": lambda ids: plain(ids, prompt_lookup_num_tokens=k)}
    for fn in runs.values(): fn(prompts[0])  # warm-up
    speeds, outs = {name: [] for name in runs}, {}
    for _ in range(a.repeats):
        for name, fn in runs.items(): outs[name], tps = timed(fn, prompts); speeds[name].append(tps)
    base = statistics.median(speeds["generate (target alone)"])
    def acc(key):  # drafts kept / proposed, and tokens per target pass in the rounds (each adds its kept drafts and one more)
        st = stats.get(key, {})
        return (round(st["accepted"] / st["proposed"], 3), round(1 + st["accepted"] / st["rounds"], 2)) if st.get("proposed") else (None, None)
    accept = {"speculative_rounds, draft as trained": acc(id(draft)), "speculative_rounds, distilled draft": acc(id(distilled)),
              "speculative_rounds, n-gram": acc("ngram")}
    rows = []
    for name in runs:
        tps = statistics.median(speeds[name])
        rows.append(dict(engine="transformers", method=name, tokens_per_s=round(tps, 1), speedup=round(tps / base, 2),
                         acceptance=accept.get(name, (None,))[0], tokens_per_target_pass=accept.get(name, (None, None))[1], same_as_greedy=outs[name] == outs["generate (target alone)"]))
    if not a.no_vllm:
        try:
            v = vllm_rows(a.target, distilled_dir, [tok.decode(p) for p in prompts], n, k, a.threads)
            vb = v["vllm"]["tokens_per_s"]
            for name, r in v.items():
                rows.append(dict(engine="vllm", method=name, tokens_per_s=round(r["tokens_per_s"], 1), speedup=round(r["tokens_per_s"] / vb, 2),
                                 acceptance=r["acceptance"] and round(r["acceptance"], 3), tokens_per_target_pass=None, same_as_greedy=r["texts"] == v["vllm"]["texts"]))
        except FileNotFoundError as e: print(f"vLLM skipped: {e}")
    best = next(r for r in rows if r["method"] == "speculative_rounds, distilled draft")
    headline = dict(metric=f"speculative decoding at batch 1: {best['method']} / the target alone (tokens/s; acceptance {best['acceptance']})",
                    value=best["speedup"], target=">= 2")
    from codellm_nb.measure import md_table, save_result
    save_result(a.out, dict(headline=headline, target=a.target, draft=a.draft, target_params=params(target), draft_params=params(draft),
                            prompts=a.prompts, max_tokens=n, k=k, threads=a.threads, distill_steps=a.distill_steps,
                            distill_s=float((distilled_dir / "distill_s.txt").read_text()), repeats=a.repeats, rows=rows))
    print(md_table(rows)); print(headline)

if __name__ == "__main__": main()
