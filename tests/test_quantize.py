"""Quantized models, for real: llama.cpp GGUF (`make llamacpp`) against transformers token for token, and every
quantization method's folder reloaded from disk into the gateway, answering through the OpenAI API."""
import asyncio, time
import openai, pytest, torch
from conftest import tiny_llama
from transformers import AutoModelForCausalLM
from codellm_nb.quantize import CALIBRATED, METHODS, importance_matrix, quantize_model, to_gguf
from codellm_nb.serve import LlamaCppEngine, collect, resolve_engine, start_server

PROMPTS = ["def add(a, b):\n", "import os\n", "class Stack:\n    def __init__(self", "for i in range(", "x = {", "\n"]

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    "A random tiny Llama with the project's tokenizer (see `conftest.tiny_llama`)."
    return tiny_llama(tmp_path_factory.mktemp("model"))

@pytest.fixture(scope="module")
def calib(model):
    "Calibration windows: the standard library's json package as token ids, 8 windows of 64."
    import sysconfig
    from pathlib import Path
    from transformers import AutoTokenizer
    text = "".join(p.read_text() for p in sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py")))
    ids = AutoTokenizer.from_pretrained(model)(text, add_special_tokens=False).input_ids
    return torch.tensor(ids[:8 * 64]).view(8, 64)

def greedy(model_dir, tok, prompt, n):
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

def test_llama_cpp_f32_gives_transformers_greedy_text_and_q8_0_stays_close(model, tmp_path):
    eng = LlamaCppEngine(to_gguf(model, tmp_path / "f32", "f32"))
    try:
        for p in PROMPTS:  # same weights, another engine: the same 24 greedy tokens
            text, fin = asyncio.run(collect(eng.stream(p, max_tokens=24)))
            assert text == greedy(model, eng.tok, p, 24), p
            assert fin["prompt_tokens"] == len(eng.tok(p, add_special_tokens=False).input_ids) and fin["completion_tokens"] >= 1
        free = asyncio.run(collect(eng.stream("def f(", max_tokens=40)))[0]
        stop = free[5:7]
        cut, fin = asyncio.run(collect(eng.stream("def f(", max_tokens=40, stop=[stop])))
        assert cut == free[:free.index(stop)] and fin["finish_reason"] == "stop"
        sample = lambda s: asyncio.run(collect(eng.stream("def f(", max_tokens=24, temperature=1.0, top_p=0.9, seed=s)))[0]
        assert sample(7) == sample(7) != sample(8)
    finally: eng.close()
    q8 = LlamaCppEngine(to_gguf(model, tmp_path / "q8_0", "q8_0"))
    try: same = sum(asyncio.run(collect(q8.stream(p, max_tokens=16)))[0] == greedy(model, q8.tok, p, 16) for p in PROMPTS)
    finally: q8.close()
    assert same >= 3, same  # 8-bit blocks: most greedy continuations of a random model survive

def test_llama_cpp_engine_batches_more_clients_than_slots(model, tmp_path):
    "Six clients at once on two slots: each gets the text it gets alone, waiting ones take freed slots, a client that leaves frees its slot."
    eng = LlamaCppEngine(to_gguf(model, tmp_path / "f32", "f32"), slots=2)
    try:
        async def together(): return await asyncio.gather(*[collect(eng.stream(p, max_tokens=16)) for p in PROMPTS])
        got = asyncio.run(together())
        assert [g[0] for g in got] == [greedy(model, eng.tok, p, 16) for p in PROMPTS]
        async def leave_early():
            s = eng.stream(PROMPTS[0], max_tokens=200)
            await s.__anext__(); await s.aclose()  # the client goes after its first delta
        asyncio.run(leave_early())
        deadline = time.time() + 30  # the departing request frees its slot at the engine's next step
        while eng.counts()["active"] and time.time() < deadline: time.sleep(0.02)
        assert eng.counts() == dict(received=len(PROMPTS) + 1, served=len(PROMPTS) + 1, active=0, waiting=0)
    finally: eng.close()
    with pytest.raises(Exception, match="closed"): asyncio.run(collect(eng.stream("x = 1", max_tokens=4)))

def test_llama_cpp_engine_counts_add_up_whenever_read(model, tmp_path):
    "Read from another thread all through a burst (clients leaving early too): the counts never contradict each other."
    import threading
    eng, seen, done = LlamaCppEngine(to_gguf(model, tmp_path / "f32", "f32"), slots=2), [], threading.Event()
    def watch():
        while not done.is_set(): seen.append(eng.counts())
    reader = threading.Thread(target=watch); reader.start()
    try:
        async def burst():
            async def leave(p):
                s = eng.stream(p, max_tokens=50); await s.__anext__(); await s.aclose()
            await asyncio.gather(*[collect(eng.stream(p, max_tokens=12)) for p in PROMPTS], *[leave(p) for p in PROMPTS[:3]])
        asyncio.run(burst())
        deadline = time.time() + 30
        while eng.counts()["active"] and time.time() < deadline: time.sleep(0.02)
    finally: done.set(); reader.join(); eng.close()
    n = len(PROMPTS) + 3
    assert len(seen) > 10 and seen[-1] == dict(received=n, served=n, active=0, waiting=0), seen[-1]
    for a, b in zip(seen, seen[1:]):
        assert 0 <= b["active"] <= 2 and b["waiting"] >= 0 and b["received"] >= a["received"] and b["served"] >= a["served"], (a, b)

def test_llama_cpp_engine_fails_one_request_not_the_thread(model, tmp_path, monkeypatch):
    "Sampling that raises mid-decode (e.g. logits that are not finite) fails that request; the engine keeps serving."
    import itertools
    import codellm_nb.serve as S
    eng, real, calls = LlamaCppEngine(to_gguf(model, tmp_path / "q8_0", "q8_0"), slots=2), S.pick_token, itertools.count()
    def flaky(logits, t, p, rng):
        if t == 0.5 and next(calls) == 2: raise ValueError("not finite")
        return real(logits, t, p, rng)
    monkeypatch.setattr(S, "pick_token", flaky)
    try:
        with pytest.raises(Exception, match="llama.cpp failed: not finite"):
            asyncio.run(asyncio.wait_for(collect(eng.stream("def f(", max_tokens=8, temperature=0.5)), 30))
        assert asyncio.run(collect(eng.stream("def f(", max_tokens=4)))[1]["completion_tokens"] == 4 and eng.ready()
    finally: eng.close()

def test_engines_refuse_a_format_they_cannot_read(model, tmp_path):
    g = to_gguf(model, tmp_path / "q4_0", "q4_0")
    assert resolve_engine("auto", g) == "llamacpp" and resolve_engine("llamacpp", g) == "llamacpp"
    for e in ("vllm", "transformers"):
        with pytest.raises(ValueError, match="use engine=llamacpp or auto"): resolve_engine(e, g)
    with pytest.raises(ValueError, match="engine=llamacpp serves GGUF folders"): resolve_engine("llamacpp", model)
    with pytest.raises(FileNotFoundError, match="has no .gguf file"): LlamaCppEngine(model)

def test_calibrated_models_reload_as_they_were_written(model, calib, tmp_path):
    "SmoothQuant's per-channel scales are saved with the weights (without them the reloaded model would be wrong, not slower)."
    q = quantize_model(model, tmp_path / "sq", "w8a8_sq", embeddings=True, calib=calib)
    x = calib[:2]
    with torch.no_grad():
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sq", dtype=torch.float32)(x).logits
        assert torch.equal(q(x).logits, reloaded)
    imp = importance_matrix(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), calib)
    assert set(imp) == {n for n, m in q.named_modules() if isinstance(m, torch.nn.Linear)} and all((v > 0).all() for v in imp.values())
    a = (to_gguf(model, tmp_path / "pure", "q4_0_pure") / "model.gguf").read_bytes()
    b = (to_gguf(model, tmp_path / "imx", "q4_0_imatrix", imatrix=imp) / "model.gguf").read_bytes()
    assert len(a) == len(b) and a != b  # same layout and size, other roundings
    with pytest.raises(ValueError, match="is calibrated"): to_gguf(model, tmp_path / "x", "q4_0_imatrix")

@pytest.mark.parametrize("method", [*METHODS, "q8_0", "q4_0", "q4_0_imatrix"])
def test_every_quantized_model_reloads_and_answers_through_the_openai_api(model, calib, tmp_path, method):
    "Written to disk, reloaded by the gateway's engine (llama.cpp for GGUF, transformers for torchao), asked over HTTP."
    d = tmp_path / method
    if method in METHODS: quantize_model(model, d, method, embeddings=True, calib=calib if method in CALIBRATED else None)
    else:
        imp = importance_matrix(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), calib) if method in CALIBRATED else None
        to_gguf(model, d, method, imatrix=imp)
    with start_server(d, name="q", engine="auto" if method not in METHODS else "transformers", replicas=1 if method not in METHODS else 0) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        r = client.completions.create(model="q", prompt=PROMPTS[0], max_tokens=12, temperature=0)
        assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length")
        streamed = "".join(c.choices[0].text for c in client.completions.create(model="q", prompt=PROMPTS[0], max_tokens=12,
                                                                                 temperature=0, stream=True) if c.choices)
        assert streamed == r.choices[0].text
        chat = client.chat.completions.create(model="q", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
        assert chat.choices[0].message.role == "assistant"
