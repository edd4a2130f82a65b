"""The data stage on datatrove: one worker or two, killed and restarted, or submitted to Slurm — the same output."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest, zstandard
from hypothesis import given, settings, strategies as st
from conftest import examples
from codellm_nb.core import get_preset

SETTINGS = dict(max_files=100, vocab_size=1024, pref_pairs=0, data_tasks=4)
BUILD = "import sys; from codellm_nb.core import get_preset; from codellm_nb.data import build_data; " \
        "build_data(sys.argv[1], get_preset('tiny', data_workers=int(sys.argv[2]), **{s.split('=')[0]: int(s.split('=')[1]) for s in sys.argv[3:]}))"

def build(run:Path, workers:int, **kw) -> subprocess.CompletedProcess:
    "`build_data` for the test preset in a fresh process (as `codellm data` runs it)."
    args = [f"{k}={v}" for k, v in (SETTINGS | kw).items()]
    return subprocess.run([sys.executable, "-c", BUILD, str(run), str(workers), *args], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))

def outputs(run:Path) -> dict:
    "What the data stage produced, byte for byte where it is data: documents, token shards, stats (timings aside)."
    from datasets import load_from_disk
    d = run / "data"
    stats = json.loads((d / "stats.json").read_text())
    shards = {p.name: p.read_bytes() for p in sorted((d / "shards").glob("*.bin"))}
    docs = {p.name: zstandard.ZstdDecompressor().stream_reader(p.open("rb")).read() for p in sorted((d / "corpus" / "documents").glob("*.jsonl.zst"))}
    return dict(stats=stats, documents=load_from_disk(str(d / "documents")).to_list(), files=docs, shards=shards,
                index=json.loads((d / "shards" / "index.json").read_text()), sft=(d / "sft.jsonl").read_bytes())

@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("one")
    r = build(run, 1)
    assert r.returncode == 0, r.stderr[-3000:]
    return outputs(run)

def test_two_workers_write_what_one_writes(one_worker, tmp_path):
    r = build(tmp_path, 2)
    assert r.returncode == 0, r.stderr[-3000:]
    two = outputs(tmp_path)
    assert two["stats"]["train_tokens"] > 0 and len(two["shards"]) == 8  # a train and a val shard per task
    for k in one_worker: assert two[k] == one_worker[k], k

def test_a_killed_job_restarts_to_the_same_output(one_worker, tmp_path):
    "SIGKILL the whole job once some tasks of its first stage are done; the rerun skips them and writes the same bytes."
    args = [f"{k}={v}" for k, v in SETTINGS.items()]
    p = subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path), "1", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    done = tmp_path / "data" / "corpus" / "logs" / "filter" / "completions"
    deadline = time.time() + 300
    while not (done.exists() and len(list(done.iterdir())) >= 2) and p.poll() is None and time.time() < deadline: time.sleep(0.01)
    os.killpg(p.pid, signal.SIGKILL); p.wait()
    finished = sorted(x.name for x in done.iterdir())
    assert 2 <= len(finished) < 4 and not (tmp_path / "data" / "stats.json").exists(), f"killed too late: {finished}"
    r = build(tmp_path, 1)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"filter: {4 - len(finished)} of 4 tasks run" in r.stderr, r.stderr[-2000:]
    again = outputs(tmp_path)
    for k in one_worker: assert again[k] == one_worker[k], k

FAKE_SBATCH = """#!/usr/bin/env python3
"Slurm's sbatch for one machine: runs every task of the array now, in order, and prints a job id."
import os, re, subprocess, sys
script = open(sys.argv[-1]).read()
env = dict(os.environ, SLURM_NODELIST="localhost", SLURM_JOB_ID="1")
for a in sys.argv[1:-1]:
    if a.startswith("--export=ALL,"): env.update(kv.split("=", 1) for kv in a[len("--export=ALL,"):].split(","))
m = re.search(r"^#SBATCH --array=0-(\\d+)", script, re.M)
with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:-1]) + "\\n")
    for i in range(int(m[1]) + 1 if m else 1):
        if m: env["SLURM_ARRAY_TASK_ID"] = str(i)
        subprocess.run(["bash", "-c", script], env=env, check=True, stdout=log, stderr=log)
print("Submitted batch job", sum(1 for _ in open(os.environ["FAKE_SLURM_LOG"])))
"""
FAKE_SRUN = """#!/usr/bin/env bash
# Slurm's srun for one task on this machine: drop the options, run the command.
while [[ "$1" == -* ]]; do case "$1" in -n|-N) shift 2;; *) shift;; esac; done
exec "$@"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
# Slurm's scontrol, for the one question asked: `scontrol show hostnames LIST`.
[[ "$1 $2" == "show hostnames" ]] && echo "${3:-localhost}"
"""

def test_the_slurm_executor_runs_the_stages(tmp_path, monkeypatch):
    "The stages submitted as chained Slurm arrays (sbatch, srun and scontrol played by scripts) write what the local executor writes."
    from codellm_nb.scale import corpus_stats, iter_documents, run_corpus
    from codellm_nb.sources import list_items, sample_items
    bin_ = tmp_path / "bin"; bin_.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_ / name).write_text(text); (bin_ / name).chmod(0o755)
    cfg = get_preset("tiny", decontaminate="", num_perm=16)  # 4 bands: 4 bucket tasks, each a process here
    items = sample_items(list_items(["stdlib"]), 40, 0)
    local = run_corpus(items, tmp_path / "local", cfg, tasks=2, workers=1)
    monkeypatch.setenv("PATH", f"{bin_}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "slurm.log"))
    assert run_corpus(items, tmp_path / "slurm", cfg, tasks=2, executor="slurm", partition="cpu") == {}
    submitted = (tmp_path / "slurm.log").read_text()
    assert "--dependency=afterok:" in submitted, submitted[-2000:]  # each stage waits for the one before
    assert corpus_stats(tmp_path / "slurm") == local
    assert list(iter_documents(tmp_path / "slurm", 2)) == list(iter_documents(tmp_path / "local", 2))

def test_bad_settings_are_refused(tmp_path, monkeypatch):
    from codellm_nb.scale import make_executor, run_corpus
    with pytest.raises(ValueError, match="use one of local, slurm, ray"): make_executor("spark", [], 1, 1, "x")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch: a Slurm executor is built (to read its script), not run
    assert make_executor("slurm", [], 2, 2, tmp_path / "logs").get_sbatch_args(2)["array"] == "0-1%2"  # 2 tasks, 2 at a time
    with pytest.raises(RuntimeError, match="sbatch, which is not on PATH"): run_corpus([], tmp_path / "job", get_preset("tiny"), executor="slurm")
    assert not (tmp_path / "job").exists()  # refused before anything was written
    with pytest.raises(ValueError, match="data_engine must be datatrove or datasets"): get_preset("tiny", data_engine="spark")
    with pytest.raises(ValueError, match="data_tasks and shard_mb must be at least 1"): get_preset("tiny", data_tasks=0)

def test_the_engines_agree_near_the_threshold(tmp_path):
    """Both engines on copies edited at rates around the threshold — the pairs LSH finds or misses by chance and
    verification keeps or drops by a hair, where a shortcut in either would show: same documents, same stats."""
    import dataclasses, random
    from datasets import load_from_disk
    from codellm_nb.data import build_documents
    from codellm_nb.sources import read_code, stdlib_files
    from codellm_nb.testing import perturb
    texts = [t for p in stdlib_files(400) for t, why in [read_code(p)] if why is None and 3_000 < len(t) < 30_000][:24]
    rng, rows = random.Random(0), []
    for i, t in enumerate(texts):
        rows.append(dict(path=f"orig/{i}.py", text=t))
        for j, frac in enumerate((0.02, 0.08, 0.15, 0.25)):  # from clear copies to clear non-copies
            if rng.random() < 0.5: rows.append(dict(path=f"copy/{i}_{j}.py", text=perturb(t, rng.choice(["edit", "all"]), seed=i * 10 + j, frac=frac)))
    rng.shuffle(rows)  # copies before and after their originals, in other tasks
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(dict(r, license="MIT", lang="python")) + "\n" for r in rows))
    cfg = get_preset("tiny", sources=f"jsonl:{corpus}", max_files=0, data_tasks=3, data_workers=2)
    dt, mem = build_documents(cfg, tmp_path / "dt"), build_documents(dataclasses.replace(cfg, data_engine="datasets"), tmp_path / "mem")
    assert dt["dedup"]["near_removed"] > 6 and dt["dedup"]["near_clusters"] > 4, dt["dedup"]  # the corpus tests something
    assert dt == mem
    assert load_from_disk(str(tmp_path / "dt" / "documents")).to_list() == load_from_disk(str(tmp_path / "mem" / "documents")).to_list()

def test_a_job_folder_can_be_any_fsspec_path(tmp_path):
    "Every file of a job goes through fsspec: an in-memory file system stands in for an object store, same result."
    import fsspec
    from codellm_nb.scale import corpus_stats, iter_documents, run_corpus
    from codellm_nb.sources import list_items, sample_items
    cfg = get_preset("tiny", decontaminate="")
    items = sample_items(list_items(["stdlib"]), 40, 1)
    local = run_corpus(items, tmp_path / "local", cfg, tasks=2)
    try:
        assert run_corpus(items, "memory://codellm-job", cfg, tasks=2) == local  # one worker: tasks run in this process
        assert corpus_stats("memory://codellm-job") == local
        assert list(iter_documents("memory://codellm-job", 2)) == list(iter_documents(tmp_path / "local", 2))
        assert fsspec.filesystem("memory").exists("/codellm-job/documents/index.json")
        assert not (tmp_path / "codellm-job").exists() and not Path("codellm-job").exists()
    finally: fsspec.filesystem("memory").rm("/codellm-job", recursive=True)

def test_a_directory_with_an_evaluation_leak(tmp_path):
    "A folder whose one file repeats a HumanEval solution: both engines drop that file and report it the same way."
    import dataclasses, shutil, sysconfig
    from codellm_nb.data import build_documents
    from codellm_nb.dedup import humaneval_items
    src = tmp_path / "src"; src.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shutil.copy(stdlib.parent / "LICENSE.txt" if (stdlib.parent / "LICENSE.txt").exists() else stdlib / "LICENSE.txt", src / "LICENSE")
    for p in sorted((stdlib / "json").glob("*.py")): shutil.copy(p, src / p.name)
    (src / "leak.py").write_text("import math\n\n" + humaneval_items()[0]["texts"][0] + "\nprint(has_close_elements([1.0], 0.5))\n")
    cfg = get_preset("tiny", sources=f"dir:{src}", max_files=0, data_tasks=2)
    dt = build_documents(cfg, tmp_path / "dt")  # raised TypeError in read_counts: it read the list of removed documents
    mem = build_documents(dataclasses.replace(cfg, data_engine="datasets"), tmp_path / "mem")
    assert dt["decontamination"]["removed"] == 1 and dt["decontamination"]["removed_docs"][0]["doc"] == "src/leak.py"
    assert dt == mem

def both_engines(root:Path, out:Path, tasks:int=3) -> tuple:
    "`build_documents` of folder `root` on each engine: `(stats, documents)` or the error it raised, per engine."
    import dataclasses
    from datasets import load_from_disk
    from codellm_nb.data import build_documents
    cfg = get_preset("tiny", sources=f"dir:{root}", max_files=0, data_tasks=tasks, data_workers=1)
    res = []
    for engine in ("datatrove", "datasets"):
        try: stats = build_documents(dataclasses.replace(cfg, data_engine=engine), out / engine)
        except ValueError as e: res.append(f"ValueError: {e}"); continue  # the one refusal a corpus may earn: nothing usable
        res.append((stats, load_from_disk(str(out / engine / "documents")).to_list()))
    return tuple(res)

FILE = st.tuples(st.integers(0, 14), st.integers(0, 999), st.integers(0, 999), st.integers(0, 11))

@pytest.mark.generated
@given(recipe=st.lists(FILE, min_size=1, max_size=30), license=st.integers(0, 3), tasks=st.integers(1, 3))
@settings(**examples(3))
def test_the_engines_agree_on_generated_trees(tmp_path_factory, recipe, license, tasks):
    "Any tree of files (`write_corpus`): neither engine crashes, and both keep the same documents with the same stats."
    from codellm_nb.testing import write_corpus
    d = tmp_path_factory.mktemp("tree")
    dt, mem = both_engines(write_corpus(d / "src", recipe, license), d, tasks)
    assert dt == mem
