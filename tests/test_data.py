"""The data stage's optional self-instruct source, wired end to end against the project's own server."""
import json, shutil
from codellm_nb.core import get_preset
from codellm_nb.data import build_data
from codellm_nb.serve import start_server
from codellm_nb.testing import canned_chat_model

def test_self_instruct_source_in_the_data_stage(data_run, tmp_path):
    model = canned_chat_model([([{"role": "user", "content": "hi"}], "def one():\n    return 1\n")], tmp_path / "canned")
    conf = json.loads((model / "config.json").read_text())  # room for the few-shot prompts (RoPE: any length runs)
    (model / "config.json").write_text(json.dumps(dict(conf, max_position_embeddings=4096)))
    run = tmp_path / "run"; shutil.copytree(data_run / "data", run / "data")
    with start_server(model, name="canned") as url:
        stats = build_data(run, get_preset("tiny", max_files=120, vocab_size=1024, self_instruct_url=url, self_instruct_n=2))
    si = stats["sft"]["self_instruct"]
    assert si["requests"] == 2 and si["errors"] == 0  # the model name came from the server's /v1/models
    steps = {p.stem: json.loads(p.read_text())["fingerprint"] for p in (run / "data" / "steps").glob("*.json")}
    assert set(steps) == {"documents", "tokenizer", "sft", "prefs"}
    assert (run / "data" / "sft_context_response.jsonl").exists()
    rec = json.loads(open(run / "data" / "sft_context_response.jsonl").readline())
    assert set(rec) >= {"context", "response"}
