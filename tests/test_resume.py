"""Fault tolerance and multi-node, launched for real on this machine.

- kill -9 a two-rank ZeRO-3 run at a random step, resume it, and the final weights equal an uninterrupted run's;
- a truncated newest checkpoint is detected and skipped, and training resumes from the one before;
- two "nodes" on loopback (torchrun --nnodes 2) train exactly like two ranks on one node."""
import json, os, random, signal, subprocess, sys, time
import numpy as np, psutil, pytest
from safetensors.numpy import load_file
from conftest import ROOT, codellm

STEPS = 30
CFG = [f"steps={STEPS}", "warmup=2", "eval_every=10", "ckpt_every=3", "keep_ckpts=2", "precision=fp32", "seq_len=64",
       "batch_seqs=16", "micro_batch=4", "n_layers=2", "hidden=64", "n_heads=4", "n_kv_heads=2", "ffn=128", "ranks=2"]

def weights(run): return load_file(str(run / "pretrain" / "hf" / "model.safetensors"))

def same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa: np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)

def new_run(tmp_path, data_run, name):
    run = tmp_path / name; run.mkdir(); (run / "data").symlink_to(data_run / "data")
    return run

@pytest.fixture(scope="module")
def uninterrupted(data_run, tmp_path_factory):
    run = new_run(tmp_path_factory.mktemp("full"), data_run, "run")
    r = codellm("pretrain", "--run-dir", run, "--set", *CFG)
    assert r.returncode == 0, r.stderr[-3000:]
    return run

def test_kill_and_resume_gives_identical_weights(uninterrupted, data_run, tmp_path):
    run = new_run(tmp_path, data_run, "killed")
    kill_at = random.Random().randint(4, STEPS - 10)
    p = subprocess.Popen([sys.executable, "-m", "codellm_nb.cli", "pretrain", "--run-dir", str(run), "--set", *CFG],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    metrics, t0 = run / "pretrain" / "metrics.jsonl", time.time()
    while time.time() - t0 < 300 and p.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= kill_at: break
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before it could be killed"
    procs = [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)  # the launcher and every rank
    os.killpg(p.pid, signal.SIGKILL)  # SIGKILL to the whole session at once: a crash, not a shutdown
    for q in procs:  # anything that left the process group; short-lived helpers may already be gone
        try: q.kill()
        except psutil.NoSuchProcess: pass
    p.wait(); psutil.wait_procs(procs, timeout=10)
    assert not (run / "pretrain" / "manifest.json").exists()
    r = codellm("pretrain", "--run-dir", run, "--resume", "--set", *CFG)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "pretrain" / "manifest.json").read_text())["metrics"]
    assert 0 < m["resumed_from"] < STEPS and m["resumed_from"] % 3 == 0, (kill_at, m["resumed_from"])
    same_weights(run, uninterrupted)
    steps = [json.loads(l)["step"] for l in open(metrics)]
    assert steps == list(range(1, STEPS + 1))  # the log has each step once, whatever the crash left behind

def test_truncated_checkpoint_is_skipped(uninterrupted, tmp_path):
    import shutil
    run = tmp_path / "copy"; shutil.copytree(uninterrupted, run, symlinks=True)
    ckpts = sorted((run / "pretrain" / "checkpoints").glob("step*"), key=lambda d: int(d.name[4:]))
    assert [d.name for d in ckpts] == [f"step{STEPS - 3}", f"step{STEPS}"]  # keep_ckpts=2
    victim = max((f for f in ckpts[-1].rglob("*.pt")), key=lambda f: f.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    r = codellm("pretrain", "--run-dir", run, "--resume", "--set", *CFG)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"skipping checkpoint step{STEPS}" in r.stdout + r.stderr and "truncated" in r.stdout + r.stderr
    assert json.loads((run / "pretrain" / "manifest.json").read_text())["metrics"]["resumed_from"] == STEPS - 3
    same_weights(run, uninterrupted)

def test_a_fresh_run_replaces_an_earlier_runs_checkpoints(uninterrupted, tmp_path):
    "Files of two runs never mix: a bf16 run's optimizer shards next to an fp32 run's, or an old run's later steps."
    import shutil
    run = tmp_path / "again"; shutil.copytree(uninterrupted, run, symlinks=True)
    ckpts = run / "pretrain" / "checkpoints"
    shutil.copytree(ckpts / f"step{STEPS}", ckpts / f"step{2 * STEPS}")  # a longer earlier run
    shard = next((ckpts / f"step{STEPS}").rglob("zero_pp_rank_0_*optim_states.pt"))
    shutil.copy(shard, shard.with_name("bf16_" + shard.name))  # what a bf16 run names its shards
    r = codellm("pretrain", "--run-dir", run, "--set", *CFG)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "removed the checkpoints of an earlier run" in r.stdout + r.stderr
    assert sorted(d.name for d in ckpts.glob("step*")) == [f"step{STEPS - 3}", f"step{STEPS}"]
    assert not list(ckpts.rglob("bf16_*"))
    same_weights(run, uninterrupted)

def test_two_nodes_on_loopback_match_one_node(uninterrupted, data_run, tmp_path):
    run = new_run(tmp_path, data_run, "nodes")
    port = 29600 + random.Random().randint(0, 300)
    cfg = [c for c in CFG if not c.startswith("ranks=")] + ["ranks=1", "nodes=2", "threads_per_rank=1"]
    procs = [subprocess.Popen([sys.executable, "-m", "codellm_nb.cli", "pretrain", "--run-dir", str(run), "--node-rank", str(i),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), "--set", *cfg],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    m = json.loads((run / "pretrain" / "manifest.json").read_text())["metrics"]
    assert m["world_size"] == 2
    np.testing.assert_allclose([json.loads(l)["loss"] for l in open(run / "pretrain" / "metrics.jsonl")],
                               [json.loads(l)["loss"] for l in open(uninterrupted / "pretrain" / "metrics.jsonl")], rtol=1e-5)

def test_nan_rewinds_to_the_last_checkpoint_and_skips_the_batch(data_run, tmp_path):
    run = new_run(tmp_path, data_run, "rewind")
    r = codellm("pretrain", "--run-dir", run, "--set", *CFG, "steps=12", "eval_every=0", "nan_policy=rewind",
                env={"CODELLM_INJECT_NAN": "7"})  # data batch 7 is poisoned: step 8 blows up
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rewound to step6, skipping batch 7" in r.stderr + r.stdout
    m = json.loads((run / "pretrain" / "manifest.json").read_text())["metrics"]
    assert m["rewinds"] == [dict(at_step=8, to_step=6, skipped_batch=7)] and m["skipped_batches"] == [7]
    recs = [json.loads(l) for l in open(run / "pretrain" / "metrics.jsonl")]
    assert [x["step"] for x in recs] == list(range(1, 13)) and all(np.isfinite(x["loss"]) for x in recs)
    assert np.isfinite(m["val_loss"])
    # the same run logged to MLflow (a local store in the run, as no tracking server is configured)
    from mlflow.tracking import MlflowClient
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient((run / "pretrain" / "mlruns").resolve().as_uri())
    hist = client.get_metric_history((run / "pretrain" / "mlflow_run_id").read_text(), "loss")
    assert sorted({h.step for h in hist}) == list(range(1, 13))

def test_nan_stops_with_the_fix_by_default(data_run, tmp_path):
    run = new_run(tmp_path, data_run, "stop")
    r = codellm("pretrain", "--run-dir", run, "--set", *CFG, "steps=12", "eval_every=0", env={"CODELLM_INJECT_NAN": "2"})
    assert r.returncode != 0
    assert "Loss became nan at step 3 (nan_policy=stop)" in r.stderr and "nan_policy=rewind" in r.stderr
