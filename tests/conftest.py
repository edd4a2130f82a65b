import os, sys, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

def codellm(*args, timeout=900, env=None):
    "Run the `codellm` command as a user would (with extra `env` variables); returns the CompletedProcess."
    return subprocess.run([sys.executable, "-m", "codellm_nb.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, **(env or {})))

@pytest.fixture(scope="session")
def data_run(tmp_path_factory):
    "A run directory whose data stage has finished (a small corpus, shared by the tests)."
    d = tmp_path_factory.mktemp("run")
    r = codellm("data", "--run-dir", d, "--set", "max_files=120", "vocab_size=1024")
    assert r.returncode == 0, r.stderr[-3000:]
    return d
