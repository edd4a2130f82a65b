"""The gateway as the clients people install use it: the Continue CLI (npm `@continuedev/cli`, put in .tools/ by
`make tools`), an agent that sends nine tools and a long system prompt with every chat request, streams, runs the tool
calls it gets back and sends their results."""
import contextlib, os, re, subprocess, threading, time
from pathlib import Path
import pytest, uvicorn
from conftest import ROOT, tiny_llama
from test_gateway import Scripted, tok  # noqa: F401 (a fixture)
from codellm_nb.serve import TransformersEngine, collect, free_port, make_app

CN = ROOT / ".tools" / "continue" / "node_modules" / ".bin" / "cn"
pytestmark = pytest.mark.skipif(not CN.exists(), reason="the Continue CLI is not installed: run `make tools` (scripts/clients.sh)")

@contextlib.contextmanager
def serving(app):
    "`app` on a free local port, in a thread; yields its base URL."
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True); th.start()
    deadline = time.time() + 60
    while not server.started and time.time() < deadline: time.sleep(0.05)
    try: yield f"http://127.0.0.1:{port}/v1"
    finally: server.should_exit = True; th.join(30)

def continue_cli(url:str, prompt:str, cwd:Path, home:Path) -> subprocess.CompletedProcess:
    "`cn -p PROMPT`, headless, with a config that points its chat model at `url`."
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"name: local\nversion: 1.0.0\nschema: v1\nmodels:\n  - name: local\n    provider: openai\n"
                                      f"    model: scripted\n    apiBase: {url}\n    apiKey: none\n    roles: [chat]\n")
    return subprocess.run([str(CN), "--config", str(home / "config.yaml"), "-p", prompt], cwd=cwd, capture_output=True, text=True,
                          timeout=180, env=dict(os.environ, HOME=str(home)))

def test_the_continue_cli_calls_a_tool_and_answers_from_its_result(tok, tmp_path):
    "The agent's tools reach the model, its call comes back as a tool call the CLI runs, the result goes back in."
    def reply(prompt:str) -> str:
        if (seen := re.search(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)):
            return "The note says: " + seen[1].strip()
        return 'Reading it.\n<tool_call>\n{"name": "Read", "arguments": {"filepath": "notes.txt"}}\n</tool_call>'
    eng = Scripted(tok, reply=reply, context=100_000)
    work = tmp_path / "work"; work.mkdir(); (work / "notes.txt").write_text("buy milk\n")
    with serving(make_app(eng)) as url: r = continue_cli(url, "What does notes.txt say?", work, tmp_path / "home")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "The note says:" in r.stdout and "buy milk" in r.stdout, r.stdout
    assert len(eng.prompts) == 2 and "<tools>" in eng.prompts[0] and '"name": "Read"' in eng.prompts[0]

class Recording:
    "An engine that passes everything through and keeps the text of each completion it streamed."
    def __init__(self, engine): self.engine, self.texts = engine, []
    def __getattr__(self, name): return getattr(self.engine, name)
    async def stream(self, prompt, **kw):
        text = ""
        async for x in self.engine.stream(prompt, **kw):
            if isinstance(x, str): text += x
            else: self.texts.append(text)
            yield x

def test_the_continue_cli_answers_with_what_a_real_model_generated(tmp_path):
    "A tiny Llama on the transformers engine, its context far shorter than the agent's prompt: the CLI prints its answer."
    eng = Recording(TransformersEngine(tiny_llama(tmp_path / "model"), name="scripted"))
    try:
        with serving(make_app(eng)) as url: r = continue_cli(url, "Write a function that adds two numbers.", tmp_path, tmp_path / "home")
    finally: eng.engine.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert len(eng.texts) == 1 and eng.texts[0].strip() and r.stdout.strip() == eng.texts[0].strip(), (r.stdout, eng.texts)
