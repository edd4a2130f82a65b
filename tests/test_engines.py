"""The engines behind the gateway, for real: transformers continuous batching in-process, replica processes with
failover (kill -9 under load), and vLLM in its own environment (`make vllm`)."""
import json, os, signal, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import openai, pytest, torch
from conftest import tiny_llama
from transformers import AutoModelForCausalLM
from codellm_nb.serve import TransformersEngine, start_server, vllm_python
from codellm_nb.tokenizer import train_tokenizer

PROMPTS = ["def add(a, b):\n", "import os\n", "class Stack:\n    def __init__(self", "for i in range(", "x = {", "\n"]

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    "A random tiny Llama with the project's tokenizer (see `conftest.tiny_llama`)."
    return tiny_llama(tmp_path_factory.mktemp("model"))

def test_continuous_batching_gives_plain_greedy_decoding_token_for_token(model):
    "Six prompts of different lengths decoded together, with different budgets and sampled requests alongside: each equals `generate` run alone."
    eng = TransformersEngine(model)
    noise = [dict(prompt=p, max_tokens=20, temperature=1.0) for p in PROMPTS]  # the sampling batch runs at the same time
    try: outs = eng.generate_many([dict(prompt=p, max_tokens=8 + 4 * i, temperature=0) for i, p in enumerate(PROMPTS)] + noise)[:6]
    finally: eng.close()
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for i, (p, o) in enumerate(zip(PROMPTS, outs)):
        ids = eng.tok(p, return_tensors="pt", add_special_tokens=False).input_ids
        ref = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8 + 4 * i, do_sample=False,
                          pad_token_id=eng.tok.pad_token_id)[0, ids.shape[1]:]
        assert o["text"] == eng.tok.decode(ref, skip_special_tokens=True), (p, o)
        assert o["completion_tokens"] == len(ref) and o["finish_reason"] == ("stop" if ref[-1] == eng.eos else "length")

def test_stop_sequences_and_seeded_sampling(model):
    eng = TransformersEngine(model)
    try:
        free = eng.generate_many([dict(prompt="def f(", max_tokens=40, temperature=0)])[0]["text"]
        stop = free[5:7]  # a string the greedy text contains: it must end there
        cut = eng.generate_many([dict(prompt="def f(", max_tokens=40, temperature=0, stop=[stop])])[0]
        assert cut["text"] == free[:free.index(stop)] and cut["finish_reason"] == "stop"
        same = dict(prompt="def f(", max_tokens=24, temperature=1.0, top_p=0.9, seed=7)
        noise = [dict(prompt=p, max_tokens=24, temperature=1.0) for p in PROMPTS]  # unseeded samples running alongside
        a, b, c = (eng.generate_many([same, *noise, dict(same, seed=s)]) for s in (7, 7, 8))
        assert a[0]["text"] == b[0]["text"] == a[-1]["text"]  # the same seed, the same sample, whatever else runs
        assert c[-1]["text"] != a[0]["text"]
    finally: eng.close()

def test_two_hundred_clients_over_a_small_queue_get_answers_or_429_never_a_5xx(model):
    "A real server (transformers, continuous batching) behind a queue far smaller than the crowd."
    import uvicorn
    from codellm_nb.serve import Limits, free_port, make_app
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(make_app(TransformersEngine(model, name="tiny"), limits=Limits(max_inflight=8, max_queue=16)),
                                        host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True); th.start()
    while not srv.started: time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    def one(i):
        try: return client.completions.create(model="tiny", prompt=PROMPTS[i % 6], max_tokens=64, temperature=0).choices[0].finish_reason
        except openai.APIStatusError as e: return e.status_code
    try:
        with ThreadPoolExecutor(200) as ex: got = list(ex.map(one, range(200)))
        answered, refused = [g for g in got if isinstance(g, str)], [g for g in got if not isinstance(g, str)]
        assert len(answered) + len(refused) == 200 and set(refused) <= {429, 503} and len(answered) >= 24, (len(answered), set(refused))
        assert refused, "a queue of 16 behind 8 slots cannot hold 200 clients at once"
        assert client.completions.create(model="tiny", prompt="x", max_tokens=4).choices[0].finish_reason  # healthy after
    finally: srv.should_exit = True; th.join()

def health(url): return json.load(urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5))

def test_killing_a_replica_under_load_loses_no_request_and_it_comes_back(model):
    with start_server(model, name="tiny", engine="transformers", replicas=2) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        victim = health(url)["replicas"][0]["pid"]
        stop_at, results = time.time() + 6, []
        def load(i):
            out = []
            while time.time() < stop_at:
                try: out.append(client.completions.create(model="tiny", prompt=PROMPTS[i % 6], max_tokens=48, temperature=0).choices[0].text)
                except openai.OpenAIError as e: out.append(e)
            return out
        free = client.completions.create(model="tiny", prompt="x = ", max_tokens=24, temperature=0).choices[0].text
        stops = ["\n\n\n\n", "@@@", "%%%", "^^^", "$$$", free[8:10]]  # six: OpenAI and vLLM take four; the 6th is the one that hits
        cut = client.completions.create(model="tiny", prompt="x = ", max_tokens=24, temperature=0, stop=stops)
        assert cut.choices[0].text == free[:free.index(free[8:10])] and cut.choices[0].finish_reason == "stop"
        streamed = "".join(c.choices[0].text for c in client.completions.create(model="tiny", prompt="x = ", max_tokens=24, temperature=0,
                                                                                  stop=stops, stream=True))
        assert streamed == cut.choices[0].text
        with ThreadPoolExecutor(8) as ex:
            futs = [ex.submit(load, i) for i in range(8)]
            time.sleep(2); os.kill(victim, signal.SIGKILL)
            results = [x for f in futs for x in f.result()]
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors and len(results) > 20, (len(results), errors[:3])
        t0 = time.time()
        while time.time() - t0 < 120 and not (h := health(url))["recoveries_s"]: time.sleep(0.5)
        r0 = h["replicas"][0]
        assert r0["restarts"] == 1 and r0["healthy"] and r0["pid"] != victim and h["failovers"] >= 1, h
        metrics = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics").read().decode()
        assert "codellm_replica_restarts 1.0" in metrics and "codellm_replicas_healthy 2.0" in metrics

def test_vllm_engine_behind_the_gateway(model, adapter):
    try: vllm_python()
    except FileNotFoundError as e: pytest.fail(f"{e} (make test installs it)")
    with start_server(model, name="tiny", engine="vllm", replicas=1, adapters={"sql": adapter}) as url:
        assert health(url)["engine"] == "vllm"
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        for p in PROMPTS[:3]:  # the LoRA adapter by name, over the one copy of the base vLLM keeps
            tuned = client.completions.create(model="sql", prompt=p, max_tokens=12, temperature=0).choices[0].text
            # vLLM holds back a last token that ends inside a UTF-8 character; transformers decodes it as U+FFFD
            assert tuned.rstrip("\ufffd") == merged_greedy(model, adapter, p, 12).rstrip("\ufffd") != client.completions.create(
                model="tiny", prompt=p, max_tokens=12, temperature=0).choices[0].text
        r = client.completions.create(model="tiny", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
                                      max_tokens=8, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
        chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                                     temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason in ("stop", "length")
        with ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(lambda p: client.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=0), PROMPTS * 2))
        assert [o.choices[0].text for o in outs[:6]] == [o.choices[0].text for o in outs[6:]]  # greedy: the same twice
        leader = health(url)["replicas"][0]["pid"]
        os.kill(leader, signal.SIGKILL)  # the API server dies; its engine processes are orphaned
        t0 = time.time()
        while time.time() - t0 < 180 and not (h := health(url))["recoveries_s"]: time.sleep(0.5)
        assert h["replicas"][0]["restarts"] == 1 and h["replicas"][0]["healthy"], h
        assert not group_alive(leader)  # the orphaned engine processes were stopped with it
        assert client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0).choices[0].text == outs[0].choices[0].text
        survivor = h["replicas"][0]["pid"]
    assert not group_alive(survivor)  # the gateway stops its replicas, engine processes included

def group_alive(pgid):
    try: os.killpg(pgid, 0); return True
    except ProcessLookupError: return False

def running(pid):
    "Alive and not a zombie waiting to be reaped."
    try: return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError: return False

def test_sigterm_lets_the_streams_in_flight_finish_then_stops_the_replicas(model):
    """SIGTERM to the gateway, as Kubernetes sends it at a rolling update: the streams already running end whole, new clients
    are turned away, and the gateway stops its replicas and exits once the last stream is done."""
    with start_server(model, name="tiny", engine="transformers", replicas=1) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        reqs = [dict(model="tiny", prompt=p, max_tokens=200, temperature=0) for p in PROMPTS]
        whole = [client.completions.create(**r).choices[0] for r in reqs]
        h = health(url); gateway, replica = h["pid"], h["replicas"][0]["pid"]
        streams = [iter(client.completions.create(**r, stream=True)) for r in reqs]
        firsts = [next(s).choices[0].text for s in streams]  # every stream has begun
        os.kill(gateway, signal.SIGTERM)
        t0, turned_away = time.time(), False
        while not turned_away and time.time() - t0 < 10:
            try: urllib.request.urlopen(url.removesuffix("/v1") + "/ready", timeout=2); time.sleep(0.05)
            except urllib.error.HTTPError as e: turned_away = e.code == 503
            except OSError: turned_away = True  # no longer listening
        assert turned_away, "the gateway kept taking new clients after SIGTERM"
        for i, s in enumerate(streams):
            chunks = list(s)
            assert firsts[i] + "".join(c.choices[0].text for c in chunks) == whole[i].text
            assert chunks[-1].choices[0].finish_reason == whole[i].finish_reason
        t0 = time.time()
        while (running(gateway) or group_alive(replica)) and time.time() - t0 < 30: time.sleep(0.2)
        assert not running(gateway) and not group_alive(replica), "the gateway or its replica outlived the drain"

def test_a_killed_caller_leaves_no_server_behind(model):
    """`start_server`'s caller killed by SIGKILL (an OOM kill, a cancelled job) runs no `finally`: the gateway it started and the
    gateway's replica must still go, not hold their ports and memory as orphans."""
    import subprocess, sys
    caller = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom codellm_nb.serve import start_server\n"
                               "with start_server(sys.argv[1], name='tiny', engine='transformers', replicas=1) as url:\n"
                               "    print(url, flush=True); time.sleep(600)\n", str(model)], stdout=subprocess.PIPE, text=True)
    started = []  # both lead sessions of their own
    try:
        url = caller.stdout.readline().strip()
        assert url, "the caller's server did not come up"
        h = health(url); started = [gateway, replica] = h["pid"], h["replicas"][0]["pid"]
        caller.kill(); caller.wait()
        t0 = time.time()
        while (running(gateway) or group_alive(replica)) and time.time() - t0 < 30: time.sleep(0.2)
        assert not running(gateway) and not group_alive(replica), "the gateway or its replica outlived the process that started it"
    finally:
        caller.kill(); caller.wait()
        for pid in filter(running, started):  # a failure here leaves no orphan to the tests that follow
            os.killpg(pid, signal.SIGKILL)

@pytest.fixture(scope="module")
def adapter(model, tmp_path_factory):
    "A LoRA adapter over the fixture model with random (not zero) weights, so that it changes what the model says."
    from peft import LoraConfig, get_peft_model
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    torch.manual_seed(1)
    lm = get_peft_model(base, LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
                                         init_lora_weights=False))
    d = tmp_path_factory.mktemp("adapter"); lm.save_pretrained(d)
    return d

def merged_greedy(model, adapter, prompt, n):
    from codellm_nb.serve import load_tokenizer, merge_adapter
    tok, lm = load_tokenizer(model), AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    lm = (merge_adapter(lm, adapter) if adapter else lm).eval()
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

def test_a_lora_adapter_is_served_by_name_next_to_its_base(model, adapter, tmp_path):
    "Through the gateway and a replica: the adapter's answers are the merged model's, the base's stay the base's."
    import shutil
    from codellm_nb.serve import merge_adapter
    with start_server(model, name="tiny", engine="transformers", replicas=1, adapters={"sql": adapter}) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
        assert listed == {"tiny": None, "sql": "tiny"}
        for p in PROMPTS[:3]:
            base = client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0).choices[0].text
            tuned = client.completions.create(model="sql", prompt=p, max_tokens=12, temperature=0).choices[0].text
            assert base == merged_greedy(model, None, p, 12) and tuned == merged_greedy(model, adapter, p, 12) and base != tuned
        with pytest.raises(openai.NotFoundError, match="`tiny`, `sql`"): client.completions.create(model="nope", prompt="x", max_tokens=2)
    other = tmp_path / "other"; shutil.copytree(adapter, other)  # an adapter trained over another shape is refused by name
    cfg = json.loads((other / "adapter_config.json").read_text()); cfg["r"] = 4; (other / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not fit this base model"):
        merge_adapter(AutoModelForCausalLM.from_pretrained(model), other)

def test_speculative_decoding_gives_the_targets_greedy_tokens(model, tmp_path):
    "A model draft and the n-gram draft, with budgets that end mid-round: exactly `generate`'s tokens; the engine uses it alone."
    from codellm_nb.serve import load_tokenizer, shallow_draft, speculative_rounds
    tok, target = load_tokenizer(model), AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    draft = shallow_draft(target, 1)
    for p, n in zip(PROMPTS, (7, 30, 13, 41, 20, 33)):
        ids = tok(p, add_special_tokens=False).input_ids
        x = torch.tensor([ids])
        ref = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
        for d in (draft, "ngram"):
            stats = {}
            with torch.no_grad(): out = [t for new in speculative_rounds(target, d, ids, n, k=3, eos=tok.eos_token_id, stats=stats) for t in new]
            assert out == ref, (p, d if d == "ngram" else "model")
            assert stats["rounds"] < len(out) or stats["accepted"] == 0  # rounds that accepted drafts saved target passes
            assert len(out) == 1 + stats["rounds"] + stats["accepted"]  # each round: its accepted drafts and one token of the target's
    draft.save_pretrained(tmp_path / "draft"); tok.save_pretrained(tmp_path / "draft")
    plain, eng = TransformersEngine(model), TransformersEngine(model, draft=tmp_path / "draft", spec_tokens=3)
    try:
        reqs = [dict(prompt=p, max_tokens=24, temperature=0) for p in PROMPTS]
        alone = [eng.generate_many([r])[0] for r in reqs]  # one at a time: speculative
        assert [a["text"] for a in alone] == [o["text"] for o in plain.generate_many(reqs)]
        assert eng.health()["speculative"]["proposed"] > 0
        proposed = eng.health()["speculative"]["proposed"]
        together = eng.generate_many(reqs)  # six at once: continuous batching, the same text
        assert [t["text"] for t in together] == [a["text"] for a in alone]
        assert eng.health()["speculative"]["proposed"] <= proposed + 3 * 24  # the first alone at most: the rest were batched
    finally: plain.close(); eng.close()
    other = train_tokenizer(["x = 1\n"] * 50, 300, tmp_path / "other")  # a draft of another vocabulary is refused by name
    other.save_pretrained(tmp_path / "draft")
    with pytest.raises(ValueError, match="another tokenizer"): TransformersEngine(model, draft=tmp_path / "draft")

def test_vllm_speculative_decoding_with_a_draft_gives_greedy_text(model, tmp_path):
    "vLLM's speculative config with a draft of the same tokenizer: the target's greedy text, and drafts counted in its metrics."
    import re
    from codellm_nb.serve import load_tokenizer, shallow_draft
    draft = shallow_draft(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), 1)
    draft.save_pretrained(tmp_path / "draft"); load_tokenizer(model).save_pretrained(tmp_path / "draft")
    with start_server(model, name="tiny", engine="vllm", replicas=1, draft=tmp_path / "draft", spec_tokens=3) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        for p in PROMPTS[:3]:
            got = client.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=0).choices[0].text
            assert got.rstrip("\ufffd") == merged_greedy(model, None, p, 16).rstrip("\ufffd")
        metrics = urllib.request.urlopen(health(url)["replicas"][0]["url"] + "/metrics").read().decode()
        drafted = sum(float(v) for v in re.findall(r"^vllm:spec_decode_num_draft_tokens_total(?:\{[^}]*\})? (\S+)$", metrics, re.M))
        assert drafted > 0, "vLLM proposed no draft tokens"
