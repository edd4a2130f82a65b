"""The hostile battery: each program attacks the host or the harness; each must be contained.

Contained means: it does not pass, the run finishes promptly, and the host is as it was (its files, its processes,
its network services). The checks that need root (a user per sample, a private network namespace, the private file
system, which `make test` installs bubblewrap for) are skipped only where the tests do not run as root."""
import fcntl, os, socket, sys, tempfile, threading, time
from pathlib import Path
import psutil, pytest
from codellm_nb.sandbox import SANDBOX_UIDS, capabilities, run_program
from codellm_nb.testing import HOSTILE
from codellm_nb.evaluate import check_samples, load_problems, official_verdicts

root_only = pytest.mark.skipif(not capabilities()["own_user"], reason="needs root for a user per sample")
private_fs = pytest.mark.skipif(os.geteuid() != 0 and not capabilities()["private_fs"],
                                reason="needs bubblewrap (as root it is required: `make test` installs it)")

@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_never_passes(name):
    t0 = time.perf_counter()
    r = run_program(HOSTILE[name], timeout=3)
    assert not r["passed"], r
    assert time.perf_counter() - t0 < 15

def _claimed(uid:int) -> bool:
    "Whether a running sample — of this test run or of anything else on the machine — holds sandbox user `uid`."
    path = Path(tempfile.gettempdir()) / "codellm-sandbox-uids" / str(uid)
    if not path.exists(): return False
    fd = os.open(path, os.O_RDWR)
    try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); fcntl.flock(fd, fcntl.LOCK_UN); return False
    except BlockingIOError: return True
    finally: os.close(fd)

def sandbox_processes(patience:float=3.0):
    """Live processes of sandbox users that no running sample holds: what a finished sample left behind. Samples
    that other tests or notebooks run at the same time are not counted; killed processes may linger as zombies until
    init reaps them (they hold nothing), and a dying one gets `patience` seconds to go."""
    deadline = time.time() + patience
    while True:
        left = [(p.pid, p.info["status"]) for p in psutil.process_iter(["uids", "status"])
                if p.info["uids"] and p.info["uids"].real in SANDBOX_UIDS and p.info["status"] != psutil.STATUS_ZOMBIE
                and not _claimed(p.info["uids"].real)]
        if not left or time.time() > deadline: return left
        time.sleep(0.1)

@root_only
def test_fork_bomb_leaves_no_process():
    r = run_program(HOSTILE["fork bomb"], timeout=2)
    assert not r["passed"] and sandbox_processes() == []
    r = run_program(HOSTILE["fork bomb"], timeout=2, nproc=8)  # even when some processes are allowed
    assert not r["passed"] and sandbox_processes() == []

@root_only
def test_process_limit():
    "`nproc` bounds processes and threads together; within it, threads and children work."
    for prog in ("import os; os.fork()", "import subprocess; subprocess.run(['true'])"):
        assert "BlockingIOError" in run_program(prog, nproc=1)["result"]
    assert run_program("import subprocess; subprocess.run(['true'], check=True)")["passed"]
    # 30 threads alive at once however slowly they start: each waits for an event set only after the last has started
    many = ("import threading\ne = threading.Event()\nts = [threading.Thread(target=e.wait, args=(10,), daemon=True) for _ in range(30)]\n"
            "[t.start() for t in ts]\ne.set()")
    assert "can't start new thread" in run_program(many, nproc=16)["result"]
    assert run_program(many, nproc=64)["passed"]

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
    assert not Path(r["stdout"].split()[0], "scratch.txt").exists()

WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")

@private_fs
@pytest.mark.parametrize("where", WORLD_WRITABLE)
def test_world_writable_places_keep_the_hosts_files(where):
    "Creating, changing and deleting in /tmp, /var/tmp and /dev/shm: the sample may, the host sees none of it."
    name = f"codellm-sandbox-test-{os.getpid()}"
    existing = Path(where, name + "-existing"); existing.write_text("precious"); os.chmod(existing, 0o666)
    shared = Path(where, name + "-dir"); shared.mkdir(exist_ok=True); os.chmod(shared, 0o777)  # no sticky bit
    victim = shared / "victim.txt"; victim.write_text("precious"); os.chmod(victim, 0o666)
    try:
        prog = (f"import os\nopen({str(Path(where, name + '-new'))!r}, 'w').write('x')\n"
                f"print(os.path.exists({str(existing)!r}), os.path.exists({str(victim)!r}))\n"
                f"open({str(existing)!r}, 'w').write('changed')\n")
        r = run_program(prog)
        assert r["passed"] and r["stdout"].startswith("False False"), r  # its own empty tmpfs: the host's files are not there
        r = run_program(f"import os; os.remove({str(victim)!r})")
        assert not r["passed"] and "FileNotFoundError" in r["result"]
        assert not Path(where, name + "-new").exists()
        assert existing.read_text() == "precious" and victim.read_text() == "precious"
    finally:
        existing.unlink(missing_ok=True); victim.unlink(missing_ok=True); shared.rmdir()

@private_fs
def test_cannot_read_project_run_directory_or_home(tmp_path):
    "World-readable files of the project, a run directory and the home folder are not even visible."
    run = tmp_path / "runs" / "r"; run.mkdir(parents=True); secret = run / "token.txt"; secret.write_text("hunter2")
    for d in (tmp_path, tmp_path / "runs", run): os.chmod(d, 0o755)
    os.chmod(secret, 0o644)
    home_file = next((p for p in (Path.home() / ".bashrc", Path.home() / ".profile") if p.exists()), None)
    targets = [secret, Path(__file__).resolve().parent.parent / "settings.ini"] + ([home_file] if home_file else [])
    for t in targets:
        r = run_program(f"print(open({str(t)!r}).read())")
        assert not r["passed"] and "FileNotFoundError" in r["result"] and "hunter2" not in r["stdout"], (t, r)

@private_fs
def test_installed_packages_import_but_cannot_be_changed():
    import numpy
    r = run_program("import numpy; print(numpy.__file__)")
    assert r["passed"] and r["stdout"].split()[0] == numpy.__file__
    r = run_program(f"open({numpy.__file__!r}, 'a').write('# tampered')")
    assert not r["passed"] and ("Read-only file system" in r["result"] or "PermissionError" in r["result"])

@private_fs
def test_an_environment_under_tmp_stays_visible(monkeypatch):
    "A project cloned under /tmp: its environment is bound in after the private /tmp is made, so it is still there."
    import subprocess, tempfile
    import codellm_nb.sandbox as sb
    root = Path(tempfile.mkdtemp(dir="/tmp")); env = root / "venv"; env.mkdir()
    try:
        (env / "marker.txt").write_text("here"); (root / "beside.txt").write_text("hunter2")
        for p, m in ((root, 0o755), (env, 0o755), (env / "marker.txt", 0o644), (root / "beside.txt", 0o644)): os.chmod(p, m)
        dirs = sb._python_dirs
        monkeypatch.setattr(sb, "_python_dirs", lambda: dirs() + [str(env)])
        uid = sb.SANDBOX_UID_BASE if capabilities()["own_user"] else None
        pre = sb.bwrap_argv(uid) + (sb._drop_to(uid) if uid is not None else [])
        show = subprocess.run(pre + ["cat", str(env / "marker.txt")], capture_output=True, text=True)
        assert show.stdout == "here", show.stderr
        hidden = subprocess.run(pre + ["cat", str(root / "beside.txt")], capture_output=True, text=True)
        assert hidden.returncode != 0 and "hunter2" not in hidden.stdout
    finally:
        import shutil; shutil.rmtree(root)

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

@root_only
def test_each_running_sample_has_a_user_of_its_own_across_processes():
    "Two evaluators at once (a notebook and a test run) never hand out the same sandbox user."
    import subprocess
    from codellm_nb.sandbox import _claim_uid
    uid, lock = _claim_uid()
    try:
        code = "from codellm_nb.sandbox import run_program; print(run_program('import os; print(os.getuid())')['stdout'].split()[0])"
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert other.returncode == 0 and int(other.stdout.split()[-1]) in SANDBOX_UIDS and int(other.stdout.split()[-1]) != uid
    finally: os.close(lock)

@private_fs
def test_one_sample_sees_nothing_another_wrote():
    "What a sample leaves in every place it may write is gone for the next one (a forged pass could reuse it)."
    name = f"left-{os.getpid()}.txt"
    places = ("/sandbox", "/tmp", "/var/tmp", "/dev/shm")
    assert run_program("".join(f"open({f'{d}/{name}'!r}, 'w').write('x')\n" for d in places))["passed"]
    r = run_program(f"import os; print([os.path.exists(d + '/{name}') for d in {places!r}])")
    assert r["passed"] and r["stdout"].startswith("[False, False, False, False]"), r

@private_fs
def test_the_system_files_a_program_may_read_are_readable():
    "Users, groups and the time zone (bound from the host) can be read by the sample's user: /etc was once 0700."
    r = run_program("import pwd, time; print(pwd.getpwuid(0).pw_name, open('/etc/group').read()[:4], time.localtime().tm_zone)")
    assert r["passed"] and r["stdout"].split()[:2] == ["root", "root"], r
