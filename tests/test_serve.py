"""The server answers bad input with OpenAI-shaped 4xx errors that name the field — never a 5xx.

A random-initialised tiny Llama with the project's tokenizer is enough: these tests are about the HTTP layer."""
import json, sysconfig
from pathlib import Path
import pytest, torch
from fastapi.testclient import TestClient
from transformers import LlamaConfig, LlamaForCausalLM
from codellm_nb.serve import Limits, TransformersEngine, make_app
from codellm_nb.tokenizer import train_tokenizer

@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    texts = [p.read_text() for p in sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))]
    tok = train_tokenizer(texts, 600, d)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=128, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)).save_pretrained(d)
    return TestClient(make_app(TransformersEngine(d, name="tiny"), limits=Limits(max_tokens=64, long_prompt="reject")), raise_server_exceptions=False)

OK = dict(model="tiny", prompt="def f():", max_tokens=4, temperature=0)
CHAT = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)

BAD = {  # name: (path, raw JSON body or dict, status, words the message must contain, param)
    "lone surrogate in prompt": ("/v1/completions", '{"prompt": "def f(\\ud800):", "max_tokens": 4}', 400, "lone surrogate", "prompt"),
    "lone surrogate in a chat message": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}]}', 400,
                                         "lone surrogate", "messages[0].content"),
    "lone surrogate in stop": ("/v1/completions", '{"prompt": "x", "stop": ["\\ud800"]}', 400, "lone surrogate", "stop[0]"),
    "n > 1": ("/v1/completions", dict(OK, n=2), 400, "n=2 is not supported", "n"),
    "best_of": ("/v1/completions", dict(OK, best_of=3), 400, "best_of=3", "best_of"),
    "logprobs": ("/v1/completions", dict(OK, logprobs=5), 400, "logprobs=5", "logprobs"),
    "echo": ("/v1/completions", dict(OK, echo=True), 400, "echo=True", "echo"),
    "suffix in a chat request": ("/v1/chat/completions", dict(CHAT, suffix="return 1"), 400, "suffix", "suffix"),
    "presence_penalty": ("/v1/completions", dict(OK, presence_penalty=0.5), 400, "presence_penalty", "presence_penalty"),
    "logit_bias": ("/v1/completions", dict(OK, logit_bias={"5": 10}), 400, "logit_bias", "logit_bias"),
    "chat tool without a function": ("/v1/chat/completions", dict(CHAT, tools=[{"type": "function"}]), 400, "tools[0] must be", "tools[0]"),
    "tool_choice without tools": ("/v1/chat/completions", dict(CHAT, tool_choice="required"), 400, "needs tools", "tool_choice"),
    "tool_calls not a list": ("/v1/chat/completions", dict(CHAT, messages=[{"role": "assistant", "content": None, "tool_calls": {"a": 1}}]),
                              400, "must be a list", "messages[0].tool_calls"),
    "chat top_logprobs": ("/v1/chat/completions", dict(CHAT, logprobs=True, top_logprobs=2), 400, "logprobs", None),
    "unknown field": ("/v1/completions", dict(OK, frobnicate=1), 400, "frobnicate: not supported", "frobnicate"),
    "unknown model": ("/v1/completions", dict(OK, model="gpt-4"), 404, "does not exist", "model"),
    "empty prompt list": ("/v1/completions", dict(OK, prompt=[]), 400, "empty list", "prompt"),
    "token-id prompt": ("/v1/completions", dict(OK, prompt=[1, 2, 3]), 400, "prompt", None),
    "stream with two prompts": ("/v1/completions", dict(OK, prompt=["a", "b"], stream=True), 400, "one prompt", "prompt"),
    "max_tokens 0": ("/v1/completions", dict(OK, max_tokens=0), 400, "max_tokens", "max_tokens"),
    "max_tokens over the limit": ("/v1/completions", dict(OK, max_tokens=10**6), 400, "max_tokens", "max_tokens"),
    "negative temperature": ("/v1/completions", dict(OK, temperature=-1), 400, "temperature", "temperature"),
    "top_p 0": ("/v1/completions", dict(OK, top_p=0), 400, "top_p", "top_p"),
    "prompt longer than the context": ("/v1/completions", dict(OK, prompt="x " * 400), 400, "context", "prompt"),
    "NUL in prompt": ("/v1/completions", dict(OK, prompt="def f():\x00"), 400, "NUL", "prompt"),
    "NUL in a chat message": ("/v1/chat/completions", dict(CHAT, messages=[{"role": "user", "content": "a\x00b"}]), 400, "NUL",
                              "messages[0].content"),
    "1 MB prompt": ("/v1/completions", dict(OK, prompt="x = 1\n" * 175_000), 400, "context", "prompt"),
    "not JSON": ("/v1/completions", '{"prompt": ', 400, "JSON", None),
    "JSON but not an object": ("/v1/completions", '[1, 2]', 400, "", None),
    "no prompt": ("/v1/completions", {"max_tokens": 4}, 400, "prompt", "prompt"),
    "chat without messages": ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages", "messages"),
    "chat with empty messages": ("/v1/chat/completions", dict(CHAT, messages=[]), 400, "non-empty", "messages"),
    "chat message without content": ("/v1/chat/completions", dict(CHAT, messages=[{"role": "user"}]), 400, "content is missing",
                                     "messages[0].content"),
    "tool result without content": ("/v1/chat/completions", dict(CHAT, messages=[{"role": "tool", "tool_call_id": "c1"}]), 400,
                                    "content is missing", "messages[0].content"),
    "chat message with an image part": ("/v1/chat/completions", dict(CHAT, messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
                                        400, "only text parts", "messages[0].content"),
    "chat with an unknown role": ("/v1/chat/completions", dict(CHAT, messages=[{"role": "wizard", "content": "hi"}]), 400,
                                  "role must be system, user, assistant or tool", "messages[0].role"),
    "prompt in a chat request": ("/v1/chat/completions", dict(CHAT, prompt="x"), 400, "prompt", "prompt"),
}

@pytest.mark.parametrize("name", list(BAD))
def test_bad_request_gets_a_4xx_naming_the_field(client, name):
    path, body, status, words, param = BAD[name]
    r = client.post(path, content=body if isinstance(body, str) else json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error", err
    if param: assert err["param"] == param, err
    assert "batch" not in err["message"].lower()  # no claim of batching this engine does not do

def test_unknown_model_is_openais_model_not_found(client):
    err = client.post("/v1/chat/completions", json=dict(CHAT, model="nope")).json()["error"]
    assert err["code"] == "model_not_found" and "serves `tiny`" in err["message"]

def test_wrong_method_and_path_are_4xx(client):
    assert client.get("/v1/completions").status_code == 405
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()

def test_fields_at_their_defaults_and_lists_of_prompts_are_served(client):
    r = client.post("/v1/completions", json=dict(OK, n=1, logprobs=None, echo=False, presence_penalty=0, user="me"))
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    r = client.post("/v1/completions", json=dict(OK, prompt=["def f():", "class A:"]))
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1]
    r = client.post("/v1/chat/completions", json=dict(CHAT, max_completion_tokens=3,
                                                      messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3

def test_adapter_names_are_unique_and_never_the_base_models(tmp_path):
    from codellm_nb.serve import parse_adapters, serve_forever
    a = tmp_path / "adapter"; a.mkdir(); (a / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="already given"): parse_adapters([f"sft={a}", f"sft={a}"])
    m = tmp_path / "base"; m.mkdir(); (m / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="base model is served under that name"): serve_forever(m, adapters={"base": str(a)})
    with pytest.raises(ValueError, match="base model is served under that name"): serve_forever(m, name="x", adapters={"x": str(a)})
