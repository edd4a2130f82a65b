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

def tiny_llama(d:Path) -> Path:
    """A random tiny Llama with the project's tokenizer in folder `d`: head size 32 (which vLLM's CPU attention supports),
    every layer's width a multiple of 32 (llama.cpp's and torchao's groups)."""
    import sysconfig, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from codellm_nb.tokenizer import train_tokenizer
    texts = [p.read_text() for p in sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))]
    tok = train_tokenizer(texts, 600, d)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)).save_pretrained(d)
    return d

# Generated inputs (hypothesis): a few fixed examples in `make test` (derandomized, so every run tries the same ones),
# many fresh ones in `make test-stress` (CODELLM_STRESS=1).
STRESS = os.environ.get("CODELLM_STRESS") == "1"

def examples(n:int) -> dict:
    "hypothesis settings for a test worth `n` examples in `make test` (ten times as many, and fresh ones, under stress)."
    from hypothesis import HealthCheck
    return dict(max_examples=10 * n if STRESS else n, derandomize=not STRESS, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

def pytest_configure(config):
    config.addinivalue_line("markers", "generated: a test on generated inputs (ten times the examples under `make test-stress`)")
