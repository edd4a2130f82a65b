"""Serving throughput: tokens per second at 1 and 16 concurrent clients, side by side in one run.

One model folder (the tiny pipeline's fine-tuned model by default, or `--model DIR`), the same prompts (HumanEval-style
Python function headers), greedy decoding, `--max-tokens` per request. Measured, in this order, alternating `--repeats`
times and keeping the median:

- `generate, one at a time`: `transformers`' `model.generate` per request with its KV cache, requests served one after
  another — what a server that generates one request at a time gives 16 clients (the fastest single-request call of
  the library);
- `transformers continuous batching`: `TransformersEngine.generate_many`, in-process, all requests submitted at once;
- through the gateway over HTTP with the official `openai` client from 1, 4, 16 and 64 threads (each sending 4
  requests, a steady state; once more at 16 streaming, for time to first token p50/p99), for a transformers
  replica and (when `make vllm` installed it) a vLLM replica — what a user of the server gets — and vLLM's own server
  at 16 clients without the gateway (the gateway's overhead).

The figure is the ratio of tokens/s at 16 clients to 1 client for each engine (target: well above 1; the one-at-a-time
server's ratio is 1 by construction) and each engine's 16-client throughput against the one-at-a-time baseline. Threads:
each engine, and the baseline, gets `--threads` (default 1, the fastest setting for a small model on a few cores)."""
import argparse, json, os, statistics, sys, time, urllib.request
CLIENTS = (1, 4, 16, 64)
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

def prompts(n:int) -> list[str]:
    names = ["add", "mean", "is_prime", "reverse_words", "flatten", "count_vowels", "fib", "gcd"]
    return [f'<|lang=python|>def {names[i % 8]}_{i}(x):\n    """Return the {names[i % 8].replace("_", " ")} of x."""\n' for i in range(n)]

def one_at_a_time(model_dir, ps, max_tokens) -> tuple[int, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok, lm = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    t0, n = time.perf_counter(), 0
    with torch.no_grad():
        for p in ps:
            ids = tok(p, return_tensors="pt", add_special_tokens=False).input_ids
            out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
            n += out.shape[1] - ids.shape[1]
    return n, time.perf_counter() - t0

def batched(engine, ps, max_tokens) -> tuple[int, float]:
    t0 = time.perf_counter()
    outs = engine.generate_many([dict(prompt=p, max_tokens=max_tokens, temperature=0) for p in ps])
    return sum(o["completion_tokens"] for o in outs), time.perf_counter() - t0

def over_http(url, ps, max_tokens, clients, ttft:list|None=None) -> tuple[int, float]:
    "Send `ps` from `clients` threads; with `ttft`, streamed, and each request's time to its first text appended to it."
    import openai
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    def one(p):
        if ttft is None: return client.completions.create(model="bench", prompt=p, max_tokens=max_tokens, temperature=0).usage.completion_tokens
        t0, first, n = time.perf_counter(), None, 0
        for c in client.completions.create(model="bench", prompt=p, max_tokens=max_tokens, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
            if c.choices and c.choices[0].text and first is None: first = time.perf_counter() - t0
            if c.usage: n = c.usage.completion_tokens
        ttft.append(first if first is not None else time.perf_counter() - t0)
        return n
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex: n = sum(ex.map(one, ps))
    return n, time.perf_counter() - t0

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/tiny/finetune/merged"); ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64); ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads per engine (1: on a small model more only adds overhead)")
    ap.add_argument("--out", default="benchmarks/results/serve.json")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch; torch.set_num_threads(a.threads)
    from codellm_nb.measure import md_table, save_result
    from codellm_nb.serve import TransformersEngine, start_server, vllm_python, vllm_supported
    model = Path(a.model)
    if not (model / "config.json").exists(): sys.exit(f"No model folder at {model}: run `make pipeline` first, or pass --model DIR")
    ps = prompts(a.requests)
    runs = {k: [] for k in ("generate, one at a time", "transformers continuous batching")}
    eng = TransformersEngine(model)
    batched(eng, ps[:2], 8)  # warm-up
    for _ in range(a.repeats):
        runs["generate, one at a time"].append(one_at_a_time(model, ps, a.max_tokens))
        runs["transformers continuous batching"].append(batched(eng, ps, a.max_tokens))
    eng.close()
    engines, ttft = ["transformers"], {}
    try: vllm_python(); engines += [] if vllm_supported(model) else ["vllm"]
    except FileNotFoundError as e: print(f"vLLM not measured: {e}")
    for kind in engines:
        with start_server(model, name="bench", engine=kind, replicas=1, threads=a.threads) as url:
            bare = json.load(urllib.request.urlopen(url.removesuffix("/v1") + "/health"))["replicas"][0]["url"] + "/v1"
            over_http(url, ps[:4], 8, 4)  # warm-up
            for clients in CLIENTS:  # every client sends 4 requests: a steady state, not one burst
                runs[f"{kind} replica over HTTP, {clients} client{'s' if clients > 1 else ''}"] = \
                    [over_http(url, ps * max(1, 4 * clients // len(ps)), a.max_tokens, clients) for _ in range(a.repeats)]
            ttft[kind] = []  # time to first token under load: 16 clients streaming
            runs[f"{kind} replica over HTTP, 16 clients streaming"] = [over_http(url, ps * 4, a.max_tokens, 16, ttft[kind]) for _ in range(a.repeats)]
            if kind == "vllm":  # the same load sent to the engine's own server, skipping the gateway
                runs["vllm server alone (no gateway), 16 clients"] = [over_http(bare, ps * 4, a.max_tokens, 16) for _ in range(a.repeats)]
    rows = {name: dict(tokens=r[0][0], seconds=round(statistics.median(s for _, s in r), 3),
                       tokens_per_s=round(statistics.median(n / s for n, s in r), 1)) for name, r in runs.items()}
    base = rows["generate, one at a time"]["tokens_per_s"]
    for r in rows.values(): r["vs_one_at_a_time"] = round(r["tokens_per_s"] / base, 2)
    ratios = {kind: round(rows[f"{kind} replica over HTTP, 16 clients"]["tokens_per_s"] / rows[f"{kind} replica over HTTP, 1 client"]["tokens_per_s"], 2)
              for kind in engines}
    print(md_table([dict(setup=k, **v) for k, v in rows.items()]))
    print("16 clients / 1 client:", ratios)
    q = lambda xs, f: round(1000 * sorted(xs)[min(len(xs) - 1, int(f * len(xs)))], 1)
    ttft_ms = {kind: dict(p50=q(xs, 0.5), p99=q(xs, 0.99), requests=len(xs)) for kind, xs in ttft.items()}
    print("time to first token at 16 streaming clients (ms):", ttft_ms)
    if "vllm" in engines:
        gw, alone = rows["vllm replica over HTTP, 16 clients"]["tokens_per_s"], rows["vllm server alone (no gateway), 16 clients"]["tokens_per_s"]
        print(f"gateway overhead at 16 clients: {100 * (1 - gw / alone):.1f}% of vLLM's own throughput")
        ratios["gateway_over_bare_vllm"] = round(gw / alone, 3)
    lead = "vllm" if "vllm" in ratios else "transformers"
    headline = dict(metric=f"serving, {lead} behind the gateway: tokens/s at 16 clients / 1 client (a one-at-a-time server: 1.0)",
                    value=ratios[lead], target=">= 4")
    save_result(a.out, dict(headline=headline, model=str(model), requests=a.requests, max_tokens=a.max_tokens, threads=a.threads,
                            repeats=a.repeats, rows=rows, clients_16_over_1=ratios, ttft_ms_16_clients=ttft_ms))

if __name__ == "__main__": main()
