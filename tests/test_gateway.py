"""The gateway's own logic over a scripted engine: FIM prompts, Python checks, fitting long prompts, the bounded queue,
timeouts and readiness. The engines themselves are tested in test_engines.py."""
import asyncio, json, sysconfig
from pathlib import Path
import httpx2 as httpx, openai, pytest
from fastapi.testclient import TestClient
from codellm_nb.serve import Limits, completes_python, fit_prompt, make_app, python_prefix
from codellm_nb.tokenizer import train_tokenizer

@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    texts = [p.read_text() for p in sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))]
    return train_tokenizer(texts, 600, tmp_path_factory.mktemp("tok"))

class Scripted:
    """An engine that answers from a script (greedy: `greedy`, or `reply(prompt)` if given; sampled: the next of `sampled`)
    and records its prompts."""
    kind = "scripted"
    def __init__(self, tok, greedy="", sampled=(), context=128, delay=0.0, finish="stop", reply=None):
        self.tok, self.greedy, self.sampled, self.context, self.delay, self.finish = tok, greedy, list(sampled), context, delay, finish
        self.name, self.prompts, self.budgets, self.is_ready, self.reply = "scripted", [], [], True, reply
    def ready(self): return self.is_ready
    def health(self): return dict(engine=self.kind, replicas=[dict(index=0, healthy=self.is_ready, restarts=0, inflight=None, pid=0)],
                                  failovers=0, recoveries_s=[])
    def count(self, text): return len(self.tok(text, add_special_tokens=False).input_ids)
    def close(self): pass
    async def stream(self, prompt, max_tokens=16, temperature=0.0, top_p=1.0, stop=None, seed=None):
        self.prompts.append(prompt); self.budgets.append(max_tokens)
        await asyncio.sleep(self.delay)
        text = self.sampled.pop(0) if temperature > 0 and self.sampled else self.reply(prompt) if self.reply else self.greedy
        yield text
        yield dict(finish_reason=self.finish, prompt_tokens=self.count(prompt), completion_tokens=self.count(text))

def client(engine, **limits): return TestClient(make_app(engine, limits=Limits(**limits)), raise_server_exceptions=False)

def test_suffix_becomes_a_psm_prompt_in_the_models_fim_tokens_through_the_official_client(tok):
    eng = Scripted(tok, greedy="a + b")
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client(eng), max_retries=0)
    r = oai.completions.create(model="scripted", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=8)
    assert r.choices[0].text == "a + b"
    assert eng.prompts[-1] == "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
    assert r.model_extra["codellm"][0]["python"] == "ok"  # prefix + middle + suffix parses

def test_a_model_without_fim_tokens_refuses_suffix_by_name(tmp_path):
    plain = train_tokenizer(["def f(x):\n    return x\n"] * 20, 300, tmp_path)  # our tokenizer always has them: remove them
    plain.get_vocab = lambda: {k: v for k, v in type(plain).get_vocab(plain).items() if "fim" not in k}
    r = client(Scripted(plain)).post("/v1/completions", json=dict(prompt="x = ", suffix="\n", max_tokens=4))
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix" and "fill-in-the-middle" in r.json()["error"]["message"]

def test_python_that_does_not_parse_is_regenerated_and_counted(tok):
    c = client(Scripted(tok, greedy="    return (a +\n", sampled=["    return a +\n", "    return a + b\n"]), python_retries=3)
    r = c.post("/v1/completions", json=dict(prompt="def add(a, b):\n", max_tokens=16, temperature=0)).json()
    assert r["choices"][0]["text"] == "    return a + b\n"
    assert r["codellm"] == [{"python": "fixed", "regenerated": 2}]
    metrics = c.get("/metrics").text
    assert 'codellm_python_checks_total{outcome="fixed"} 1.0' in metrics and "codellm_python_regenerations_total 2.0" in metrics

def test_python_check_gives_up_after_its_retries_and_skips_what_is_not_python(tok):
    c = client(Scripted(tok, greedy="    return (a +\n", sampled=["    return ((\n"] * 5), python_retries=2)
    r = c.post("/v1/completions", json=dict(prompt="def add(a, b):\n", max_tokens=16, temperature=0)).json()
    assert r["choices"][0]["text"] == "    return (a +\n" and r["codellm"] == [{"python": "invalid", "regenerated": 2}]
    r = c.post("/v1/completions", json=dict(prompt="Dear diary, today", max_tokens=16)).json()
    assert "codellm" not in r  # prose is not checked
    r = c.post("/v1/chat/completions", json=dict(messages=[{"role": "user", "content": "def f():\n"}], max_tokens=4)).json()
    assert "codellm" not in r  # nor are chat answers (prose around code)
    cut = client(Scripted(tok, greedy="    return (a +", finish="length"), python_retries=2)
    r = cut.post("/v1/completions", json=dict(prompt="def add(a, b):\n", max_tokens=4)).json()
    assert r["codellm"] == [{"python": "cut", "regenerated": 0}]  # out of tokens: more sampling would not help

def test_python_rules():
    assert python_prefix('def f(a):\n    """Doc."""\n') and python_prefix("<|lang=python|>import os\nx = (")
    assert not python_prefix("def f(a:\n  return )") and not python_prefix("Hello, how are you")
    assert completes_python("def f(a):\n", "    return a\n") and not completes_python("def f(a):\n", "    return (a\n")
    assert completes_python("<|lang=python|>def f(a):\n", "    return a\n")  # the language tag is not code

def test_a_long_prompt_keeps_its_header_and_nearest_context(tok):
    lines = ["import os, sys", "from json import loads"] + [f"value_{i} = loads('[{i}]')" for i in range(40)] + ["def last():"]
    prompt = "\n".join(lines) + "\n"
    eng = Scripted(tok, greedy="    pass\n", context=128)
    r = client(eng).post("/v1/completions", json=dict(prompt=prompt, max_tokens=16)).json()
    sent = eng.prompts[-1]
    assert sent.startswith("import os, sys\nfrom json import loads\n") and sent.endswith("def last():\n")
    assert eng.count(sent) <= 128 - 16 and r["codellm"][0]["prompt_tokens_dropped"] == eng.count(prompt) - eng.count(sent) > 0
    text, dropped = fit_prompt(tok, prompt, 60)
    assert tok(text, add_special_tokens=False).input_ids.__len__() <= 60 and dropped > 0
    r = client(eng, long_prompt="reject").post("/v1/completions", json=dict(prompt=prompt, max_tokens=16))
    assert r.status_code == 400 and "context is 128" in r.json()["error"]["message"]
    r = client(eng, max_prompt_tokens=500).post("/v1/completions", json=dict(prompt=prompt * 3, max_tokens=16))
    assert r.status_code == 400  # beyond max_prompt_tokens, fitting is not attempted

def test_a_prompt_that_leaves_room_is_kept_whole_and_the_output_gets_what_is_left(tok):
    eng = Scripted(tok, greedy="x", context=128)
    prompt = "".join(f"v{i} = {i}\n" for i in range(200))
    prompt = tok.decode(tok(prompt, add_special_tokens=False).input_ids[:100])  # 100 tokens: 28 left for the output
    r = client(eng).post("/v1/completions", json=dict(prompt=prompt, max_tokens=64)).json()
    assert eng.prompts[-1] == prompt and eng.budgets[-1] == 128 - eng.count(prompt)
    assert not any("prompt_tokens_dropped" in x for x in r.get("codellm", []))

def test_a_full_queue_answers_429_with_retry_after_and_serves_the_rest(tok):
    app = make_app(Scripted(tok, greedy="x", delay=0.5), limits=Limits(max_inflight=2, max_queue=2))
    async def burst():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=dict(prompt="x", max_tokens=2)) for _ in range(7)))
    rs = asyncio.run(burst())
    codes = sorted(r.status_code for r in rs)
    assert codes == [200] * 4 + [429] * 3, codes
    refused = next(r for r in rs if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1 and refused.json()["error"]["type"] == "rate_limit_error"

def test_a_slow_generation_times_out_with_504_and_a_stream_ends_with_an_error_event(tok):
    c = client(Scripted(tok, greedy="x", delay=3), timeout_s=0.3, decode_s=0, prefill_s=0)
    r = c.post("/v1/completions", json=dict(prompt="x", max_tokens=2))
    assert r.status_code == 504 and "longer than this request's limit" in r.json()["error"]["message"]
    events = [l for l in c.post("/v1/completions", json=dict(prompt="x", max_tokens=2, stream=True)).text.splitlines() if l.startswith("data: ")]
    assert "error" in json.loads(events[-2][6:]) and events[-1] == "data: [DONE]"

def test_not_ready_is_503_with_retry_after(tok):
    eng = Scripted(tok); eng.is_ready = False
    c = client(eng)
    assert c.get("/ready").status_code == 503 and c.get("/health").status_code == 200  # alive, not ready
    r = c.post("/v1/completions", json=dict(prompt="x", max_tokens=2))
    assert r.status_code == 503 and r.headers["retry-after"] == "2"

def test_evaluation_stops_when_most_requests_are_refused(tok):
    "A server that refuses the evaluation's requests (here: another model name) is an error, not a score of zero."
    from codellm_nb.evaluate import generate_samples
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client(Scripted(tok, greedy="    return 1\n")), max_retries=0)
    problems = {f"T/{i}": dict(prompt=f"def f{i}():\n") for i in range(4)}
    assert [s["completion"] for s in generate_samples(oai, "scripted", problems, workers=1)] == ["    return 1\n"] * 4
    with pytest.raises(RuntimeError, match="4 of 4 generation requests failed.*does not exist"):
        generate_samples(oai, "another", problems, workers=1)


READ = dict(type="function", function=dict(name="read_file", description="Read a file",
                                           parameters=dict(type="object", properties=dict(path=dict(type="string")), required=["path"])))
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n</tool_call>'

def test_tool_calls_reach_the_official_client_whole_and_streamed(tok):
    "A Hermes call in the answer is an OpenAI tool call, with the text before it as content; streamed, the same."
    eng = Scripted(tok, greedy="Let me read it.\n" + CALL, context=1024)
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client(eng), max_retries=0)
    ask = dict(model="scripted", messages=[{"role": "user", "content": "What does notes.txt say?"}], tools=[READ], max_tokens=64)
    r = oai.chat.completions.create(**ask)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content == "Let me read it.\n"  # the text before the call, as vLLM
    assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == [("read_file", {"path": "notes.txt"})]
    assert "<tools>" in eng.prompts[-1] and '"name": "read_file"' in eng.prompts[-1]  # the tools were in the prompt
    chunks = list(oai.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert text == "Let me read it.\n" and [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [("read_file", {"path": "notes.txt"})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls" and chunks[-1].usage.total_tokens > 0

def test_a_tool_result_comes_back_into_the_prompt_and_text_stays_text(tok):
    eng = Scripted(tok, greedy="notes.txt says: buy milk", context=1024)
    c = client(eng)
    msgs = [{"role": "user", "content": "What does notes.txt say?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                   "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "buy milk"}]
    r = c.post("/v1/chat/completions", json=dict(messages=msgs, tools=[READ], max_tokens=32)).json()
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "notes.txt says: buy milk"} and r["choices"][0]["finish_reason"] == "stop"
    assert "<tool_response>\nbuy milk\n</tool_response>" in eng.prompts[-1] and CALL in eng.prompts[-1]
    eng.greedy = '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>'  # not one of the tools: text
    r = c.post("/v1/chat/completions", json=dict(messages=msgs[:1], tools=[READ], max_tokens=32)).json()
    assert r["choices"][0]["message"]["content"] == eng.greedy and "tool_calls" not in r["choices"][0]["message"]

def test_tool_choice_none_named_and_required(tok):
    eng = Scripted(tok, greedy='{"path": "a.py"}}\n</tool_call>', context=1024)
    c, ask = client(eng), dict(messages=[{"role": "user", "content": "Read a.py"}], tools=[READ], max_tokens=32)
    r = c.post("/v1/chat/completions", json=dict(ask, tool_choice={"type": "function", "function": {"name": "read_file"}})).json()
    assert eng.prompts[-1].endswith('<tool_call>\n{"name": "read_file", "arguments": ')  # the call is begun for the model
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in r["choices"][0]["message"]["tool_calls"]] == [("read_file", '{"path": "a.py"}')]
    eng.greedy = 'read_file", "arguments": {"path": "b.py"}}\n</tool_call>'
    r = c.post("/v1/chat/completions", json=dict(ask, tool_choice="required")).json()
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"path": "b.py"}'
    eng.greedy = "no tools for this"
    r = c.post("/v1/chat/completions", json=dict(ask, tool_choice="none")).json()
    assert r["choices"][0]["message"]["content"] == "no tools for this" and "<tools>" not in eng.prompts[-1]

def test_bad_tools_are_named_without_echoing_them(tok):
    c = client(Scripted(tok, context=1024))
    big = [dict(READ, function=dict(READ["function"], name="x" * 4000))]
    r = c.post("/v1/chat/completions", json=dict(messages=[{"role": "user", "content": "hi"}], tools=big))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.name" and len(r.text) < 400, r.text
    r = c.post("/v1/chat/completions", json=dict(messages=[{"role": "user", "content": "hi"}], tools=[READ], tool_choice={"type": "function", "function": {"name": "rm"}}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = c.post("/v1/completions", json=dict(prompt="x", logit_bias={str(i): 1 for i in range(2000)}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias" and len(r.text) < 400, r.text

def test_a_template_that_renders_tools_itself_gets_them(tok):
    "Qwen-style templates take `tools` themselves: the gateway hands them over instead of writing its own block."
    import copy
    own = copy.deepcopy(tok)
    own.chat_template = ("{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
                         "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    eng = Scripted(own, greedy="ok", context=1024)
    client(eng).post("/v1/chat/completions", json=dict(messages=[{"role": "user", "content": "hi"}], tools=[READ]))
    assert eng.prompts[-1] == "TOOLS read_file user: hi\nassistant:"  # (the template engine trims the newline after a block)
