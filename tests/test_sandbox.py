"""The hostile battery: each program attacks the host or the harness; each must be contained.

Contained means: it does not pass, the run finishes promptly, and the host is as it was (its files, its processes,
its network services). The checks that need root (a user per sample, a private network namespace) are skipped
without it."""
import os, socket, sys, threading, time
from pathlib import Path
import psutil, pytest
from codellm_nb.sandbox import HOSTILE, SANDBOX_UID_BASE, capabilities, run_program
from codellm_nb.evaluate import check_samples, load_problems, official_verdicts

root_only = pytest.mark.skipif(not capabilities()["own_user"], reason="needs root for a user per sample")

@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_never_passes(name):
    t0 = time.perf_counter()
    r = run_program(HOSTILE[name], timeout=3)
    assert not r["passed"], r
    assert time.perf_counter() - t0 < 15

def sandbox_processes():
    "Live processes of the sandbox users (killed ones may linger as zombies until init reaps them: they hold nothing)."
    return [(p.pid, p.info["status"]) for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] and SANDBOX_UID_BASE <= p.info["uids"].real < SANDBOX_UID_BASE + 64
            and p.info["status"] != psutil.STATUS_ZOMBIE]

@root_only
def test_fork_bomb_leaves_no_process():
    r = run_program(HOSTILE["fork bomb"], timeout=2)
    assert not r["passed"] and sandbox_processes() == []
    r = run_program(HOSTILE["fork bomb"], timeout=2, nproc=8)  # even when some processes are allowed
    assert not r["passed"] and sandbox_processes() == []

@root_only
def test_no_new_processes():
    for prog in ("import os; os.fork()", "import subprocess; subprocess.run(['true'])"):
        assert "BlockingIOError" in run_program(prog)["result"]

@root_only
def test_escaped_children_are_killed():
    "A child that leaves the process group (setsid) and sleeps is still killed when the sample ends."
    run_program("import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\n", timeout=2)
    assert sandbox_processes() == []

@root_only
def test_host_files_untouched(tmp_path):
    keep = tmp_path / "keep.txt"; keep.write_text("precious")
    os.chmod(tmp_path, 0o755)
    prog = f"import os\nos.remove({str(keep)!r})"
    assert not run_program(prog)["passed"] and keep.read_text() == "precious"
    prog = f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')"
    assert not run_program(prog)["passed"] and not (tmp_path / "new.txt").exists()
    prog = f"open({str(keep)!r}, 'a').write('x')"
    assert not run_program(prog)["passed"] and keep.read_text() == "precious"

def test_writes_in_its_own_directory_are_allowed_and_removed():
    r = run_program("open('scratch.txt', 'w').write('x'); import os; print(os.getcwd())")
    assert r["passed"]
    assert not Path(r["stdout"].split()[0]).exists()

def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("CODELLM_SECRET_TOKEN", "hunter2")
    r = run_program("import os; print(dict(os.environ))")
    assert r["passed"] and "hunter2" not in r["stdout"]

@pytest.mark.skipif(not capabilities()["no_network"], reason="needs a private network namespace (root)")
def test_no_network_to_host_services():
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1); srv.settimeout(6)
    port = srv.getsockname()[1]
    got = []
    def accept():
        try: got.append(srv.accept())
        except OSError: pass
    th = threading.Thread(target=accept, daemon=True); th.start()
    r = run_program(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)", timeout=5)
    th.join(7); srv.close()
    assert not r["passed"] and got == []

@root_only
def test_parent_survives_kill_attempt():
    me = os.getpid()
    r = run_program("import os, signal; os.kill(os.getppid(), signal.SIGKILL)")
    assert not r["passed"] and "PermissionError" in r["result"] and os.getpid() == me

def test_output_flood_is_capped():
    r = run_program(HOSTILE["output flood"], timeout=3, max_output=1000)
    assert not r["passed"] and len(r["stdout"]) <= 1000

def test_early_exit_is_not_a_pass():
    for prog in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit(0)"):
        r = run_program(prog + "\nassert False")
        assert not r["passed"] and r["result"].startswith("failed"), (prog, r)

def test_redefining_check_does_not_help():
    "A completion cannot pre-empt the checker: the test's `check` is defined after the completion."
    p = load_problems()["HumanEval/0"]
    bad = "    return None\ndef check(candidate):\n    pass\n"
    sample = [dict(task_id="HumanEval/0", completion=bad)]
    assert [s["passed"] for s in check_samples(sample, {"HumanEval/0": p})] == [False] == official_verdicts(sample, {"HumanEval/0": p})

def test_evaluator_finishes_a_batch_of_attacks():
    "All attacks as HumanEval completions, run together on two workers: every one fails, the run completes."
    probs = load_problems(2)
    samples = [dict(task_id=t, completion="    " + prog.replace("\n", "\n    ") + "\n") for t in probs for prog in HOSTILE.values()]
    t0 = time.perf_counter()
    checked = check_samples(samples, probs, workers=2, timeout=3)
    assert len(checked) == len(samples) and not any(s["passed"] for s in checked)
    assert time.perf_counter() - t0 < 120
