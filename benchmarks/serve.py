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
each engine, and the baseline, gets `--threads` (default 1, the fastest setting for a small model on a few cores).

`--shape 135m` (the default; `--shape ''` skips it) measures again at a preset's model shape, with random weights and the
same tokenizer: what a model takes to decode, not what it writes, is what this measures. A 1.5M-parameter model makes a
token in under 2 ms, so any HTTP hop or Python step is a large share of its time; at a real model's size the engine's
arithmetic dominates, as in use. There the benchmark also measures this CPU's roofline (matmul FLOP/s and memory
bandwidth, on the same threads), which bounds what batching can gain: at batch 1 a decoder reads every weight per token
(bandwidth-bound), at batch 16 it multiplies 16 tokens per read (compute-bound once the arithmetic outgrows the reads).
The gateway's overhead is measured there twice: throughput at 16 clients through it and straight to vLLM, alternating,
and the CPU time the gateway process spends per request."""
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

def shaped_model(tok_dir, preset:str, out:Path) -> Path:
    "A model of `preset`'s layers with random weights and `tok_dir`'s tokenizer and vocabulary, saved in `out` (a few seconds)."
    import torch
    from transformers import LlamaForCausalLM
    from codellm_nb.core import get_preset
    from codellm_nb.pretrain import model_config
    from codellm_nb.serve import load_tokenizer
    tok = load_tokenizer(tok_dir); torch.manual_seed(0)
    LlamaForCausalLM(model_config(get_preset(preset), tok)).save_pretrained(out); tok.save_pretrained(out)
    return out

def roofline(model_dir) -> dict:
    "This CPU's ceiling for decoding `model_dir` at batch 1 and 16: weights read once per step, 2 FLOPs per weight per token."
    import torch
    from transformers import AutoConfig, LlamaForCausalLM
    from codellm_nb.pretrain import matmul_peak
    with torch.device("meta"): m = LlamaForCausalLM(AutoConfig.from_pretrained(model_dir))
    weights = sum(p.numel() for n, p in m.named_parameters() if "embed_tokens" not in n)  # an input embedding is looked up
    x, ts = torch.ones(64 * 2**20), []  # 256 MB: far beyond the caches, so its sum runs at memory speed
    for _ in range(5): t0 = time.perf_counter(); x.sum(); ts.append(time.perf_counter() - t0)
    bw, peak = x.numel() * 4 / min(ts), matmul_peak(n=1024)
    step = lambda b: max(4 * weights / bw, 2 * weights * b / peak)  # seconds per decode step of b sequences (fp32)
    return dict(matmul_weights=weights, matmul_gflops=round(peak / 1e9, 1), read_gb_s=round(bw / 1e9, 1),
                tokens_per_s_ceiling_batch_1=round(1 / step(1), 1), tokens_per_s_ceiling_batch_16=round(16 / step(16), 1),
                batching_ceiling_16=round(step(1) * 16 / step(16), 2))

def cpu_seconds(pid:int) -> float:
    import psutil
    t = psutil.Process(pid).cpu_times(); return t.user + t.system

def shape_part(a, tok_dir, ps) -> dict:
    "Serving at `a.shape`'s model shape: one-at-a-time generate, in-process batching, vLLM over the gateway and alone."
    from codellm_nb.serve import TransformersEngine, start_server, vllm_supported
    model = shaped_model(tok_dir, a.shape, Path("runs/bench-serve") / a.shape)
    runs = {k: [] for k in ("generate, one at a time", "transformers continuous batching")}
    eng = TransformersEngine(model); batched(eng, ps[:2], 8)
    for _ in range(a.repeats):
        runs["generate, one at a time"].append(one_at_a_time(model, ps, a.max_tokens))
        runs["transformers continuous batching"].append(batched(eng, ps, a.max_tokens))
    eng.close()
    gw_ms = []
    if not vllm_supported(model):
        with start_server(model, name="bench", engine="vllm", replicas=1, threads=a.threads) as url:
            h = json.load(urllib.request.urlopen(url.removesuffix("/v1") + "/health")); bare = h["replicas"][0]["url"] + "/v1"
            over_http(url, ps[:4], 8, 4)  # warm-up
            runs["vllm replica over HTTP, 1 client"] = [over_http(url, ps, a.max_tokens, 1) for _ in range(a.repeats)]
            for k in ("vllm replica over HTTP, 16 clients", "vllm server alone (no gateway), 16 clients"): runs[k] = []
            for _ in range(a.repeats):  # alternating, so both see the same machine
                c0 = cpu_seconds(h["pid"]); runs["vllm replica over HTTP, 16 clients"].append(over_http(url, ps * 4, a.max_tokens, 16))
                gw_ms.append(1000 * (cpu_seconds(h["pid"]) - c0) / len(ps * 4))
                runs["vllm server alone (no gateway), 16 clients"].append(over_http(bare, ps * 4, a.max_tokens, 16))
    rows = summarize(runs)
    roof = roofline(model)
    out = dict(model=f"the {a.shape} preset's layers, random weights, the tokenizer of {tok_dir}", rows=rows, roofline=roof)
    if gw_ms:
        gw, alone = rows["vllm replica over HTTP, 16 clients"]["tokens_per_s"], rows["vllm server alone (no gateway), 16 clients"]["tokens_per_s"]
        out.update(gateway_over_bare_vllm=round(gw / alone, 3), gateway_cpu_ms_per_request=round(statistics.median(gw_ms), 2),
                   vllm_16_clients_vs_one_at_a_time=rows["vllm replica over HTTP, 16 clients"]["vs_one_at_a_time"])
    return out

def summarize(runs:dict) -> dict:
    "Median tokens/s (and seconds) of each setup's repeats, and its ratio to one-at-a-time `generate`."
    rows = {name: dict(tokens=r[0][0], seconds=round(statistics.median(s for _, s in r), 3),
                       tokens_per_s=round(statistics.median(n / s for n, s in r), 1)) for name, r in runs.items()}
    base = rows["generate, one at a time"]["tokens_per_s"]
    for r in rows.values(): r["vs_one_at_a_time"] = round(r["tokens_per_s"] / base, 2)
    return rows

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/tiny/finetune/merged"); ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64); ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads per engine (1: on a small model more only adds overhead)")
    ap.add_argument("--shape", default="135m", help="also measure at this preset's model shape, random weights ('' skips it)")
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
    rows = summarize(runs)
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
    shape = shape_part(a, model, ps) if a.shape else None
    if shape:
        print(f"\n{a.shape} shape ({shape['model']}):"); print(md_table([dict(setup=k, **v) for k, v in shape["rows"].items()]))
        print("roofline:", shape["roofline"]); print({k: v for k, v in shape.items() if k not in ("rows", "roofline", "model")})
    if shape and "vllm_16_clients_vs_one_at_a_time" in shape:
        headline = dict(metric=f"serving the {a.shape} shape, vLLM behind the gateway at 16 clients: tokens/s over one-at-a-time "
                        f"generate (this CPU's fp32 ceiling: {shape['roofline']['batching_ceiling_16']})",
                        value=shape["vllm_16_clients_vs_one_at_a_time"], target=">= 10")
    else:
        lead = "vllm" if "vllm" in ratios else "transformers"
        headline = dict(metric=f"serving, {lead} behind the gateway: tokens/s at 16 clients / 1 client (a one-at-a-time server: 1.0)",
                        value=ratios[lead], target=">= 4")
    save_result(a.out, dict(headline=headline, model=str(model), requests=a.requests, max_tokens=a.max_tokens, threads=a.threads,
                            repeats=a.repeats, rows=rows, clients_16_over_1=ratios, ttft_ms_16_clients=ttft_ms,
                            **({"shape": dict(preset=a.shape, **shape)} if shape else {})))

if __name__ == "__main__": main()
