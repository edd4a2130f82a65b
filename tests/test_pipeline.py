"`codellm pipeline` runs every stage notebook through papermill and writes a report with real numbers."
import dataclasses, json, os, re
from pathlib import Path
import pytest
from conftest import ROOT, codellm
from codellm_nb.core import get_preset, read_manifest

# A quick run of every stage, for this file run on its own. It serves with the in-process engine: vLLM serving is run
# by the 05_serve and 06_eval lessons and tests/test_engines.py, and its four starts would cost minutes here.
SMALL = {"max_files": 120, "val_frac": 0.1, "vocab_size": 1024, "steps": 20, "warmup": 2, "eval_every": 10, "ft_steps": 6,
         "dpo_steps": 2, "eval_problems": 4, "eval_lines": 4, "max_new_tokens": 32, "serve_engine": "transformers"}

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished pipeline run and the preset fields it was given. The project's test run (scripts/test.sh) runs the
    stage notebooks once, as `make pipeline` does, into the folder it names in CODELLM_PIPELINE_RUN, and checks it
    here; without that variable a small run is made."""
    if os.environ.get("CODELLM_PIPELINE_RUN"): return Path(os.environ["CODELLM_PIPELINE_RUN"]).resolve(), {}
    run = tmp_path_factory.mktemp("pipeline") / "run"
    r = codellm("pipeline", "--run-dir", run, "--set", *(f"{k}={v}" for k, v in SMALL.items()), timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run, SMALL

def test_pipeline_end_to_end(finished_run, tmp_path):
    # The stages' wiring (papermill, parameters, manifests, the report) and the numbers they wrote.
    run, overrides = finished_run
    cfg = get_preset("tiny", **overrides)
    for nb in ("01_data", "02_pretrain", "03_finetune", "04_quantize", "05_serve", "06_eval"):
        assert (run / "notebooks" / f"{nb}.ipynb").exists()
    for stage in ("data", "pretrain", "finetune", "quantize", "serve", "eval"):  # the preset, as given, reached every stage
        assert read_manifest(run, stage)["config"] == dataclasses.asdict(cfg), stage
    report = (run / "report.md").read_text()
    for section in ("## Data", "## Pretraining", "## Fine-tuning", "## Quantization", "## Serving", "## Evaluation"):
        assert section in report
    val = float(re.search(r"\| val loss \| ([\d.]+) \|", report).group(1))
    assert 0 < val < 10
    ev = json.loads((run / "eval" / "results.json").read_text())
    q = json.loads((run / "quantize" / "manifest.json").read_text())
    assert q["served"] in {r["model"] for r in q["table"]} and {"fp32", "int8", "f32", "q8_0", "q4_0", "q4_0_imatrix"} == {r["model"] for r in q["table"]}
    assert all(r["tokens_per_s_batch"] > 0 for r in q["table"])  # llama.cpp's rows too: several sequences in one context
    assert q["calibration"]["methods"] == ["q4_0_imatrix"] and "Calibrated (q4_0_imatrix)" in report
    c = q["calibration"]  # up to quant_calib_samples windows, fewer on this small split: half of it is kept to measure on
    assert 1 <= c["windows"] <= 32 and c["measured_tokens"] >= c["tokens"]
    # the stages' models, compared on the same problems: the quantized one is the one the quantize stage chose to serve
    assert list(ev) == ["finetuned", "pretrained", q["served"] if q["served"] != "fp32" else "int8"]
    assert ev["finetuned"]["verdict_changes"] == 0 and all(m["verdict_changes"] >= 0 for m in ev.values())
    for m in ev.values():
        assert m["problems"] == cfg.eval_problems and m["official_agreement"] == 1.0 and 0 <= m["pass@1"] <= 1
        assert m["val_bits_per_byte"] > 0 and m["server_peak_mb"] > 0 and m["ttft_ms_p50"] > 0
    engine = json.loads((run / "serve" / "manifest.json").read_text())["metrics"]["engine"]
    assert engine == cfg.serve_engine if cfg.serve_engine != "auto" else engine in ("vllm", "transformers")
    assert (run / "eval" / "eval.png").stat().st_size > 1000 and "| pass@1 |" in (run / "eval" / "report.md").read_text()
    # The laptop tutorial, pointed at this finished run as its prose says a reader may do: every cell runs (the model
    # generates, a server answers), and every stage is read, none run again.
    import papermill as pm
    out = tmp_path / "tutorial_tiny.ipynb"
    pm.execute_notebook(str(ROOT / "nbs" / "tutorial_tiny.ipynb"), str(out), cwd=str(ROOT / "nbs"), kernel_name="python3",
                        parameters={"run_dir": str(run), "overrides": overrides}, progress_bar=False)
    printed = "".join("".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    assert printed.count(": already in ") == 5 and "written to" not in printed, printed[-3000:]

def test_pipeline_failure_names_the_notebook(tmp_path):
    r = codellm("pipeline", "--run-dir", tmp_path, "--set", "max_file_bytes=10", timeout=600)
    assert r.returncode != 0
    assert "01_data" in r.stdout + r.stderr
