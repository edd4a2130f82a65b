"The code tokenizer, resumable shard packing and the rank-aware loader, beyond what the notebook checks."
import json, threading, time
import numpy as np, pytest, torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from codellm_nb.core import LANGS
from codellm_nb.sources import read_code, stdlib_files
from codellm_nb.tokenizer import (CHAT_TOKENS, SPECIAL_TOKENS, TokenLoader, bytes_per_token, extend_vocab, is_val,
                                  load_tokens, pack_shards, token_dtype, train_tokenizer)

@pytest.fixture(scope="module")
def corpus():
    "Training texts and held-out texts from disjoint parts of the standard library."
    files = stdlib_files()
    texts = lambda fs: [t for t in (read_code(p)[0] for p in fs) if t]
    return texts(files[:60]), texts(files[-80:])

@pytest.fixture(scope="module")
def tok_dir(corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(corpus[0], 1024, d)
    return d

@pytest.fixture
def tok(tok_dir): return AutoTokenizer.from_pretrained(tok_dir)

def docs_ds(texts, langs=None):
    return Dataset.from_list([dict(id=f"doc{i}", lang=(langs or ["python"] * len(texts))[i], text=t, path=f"f{i}.py")
                              for i, t in enumerate(texts)])

ODD = ["", "x", "\t\tx = 1\r\n", "  \n\n\n    \t \n", "s = 'héllo wörld ✓ 日本語 🙂'\n", "\x00\x01\x7f", "a" * 5000,
       "print('<|eos|> <|user|> <|lang=rust|>')\n", "0x1F + 1_000_000 - 3.5e-7\n", "\u200b\ufeff"]

def test_round_trip(tok, corpus):
    for t in corpus[1] + ODD:
        assert tok.decode(tok(t, add_special_tokens=False)["input_ids"]) == t
        bt = tok.backend_tokenizer
        assert bt.decode(bt.encode(t, add_special_tokens=False).ids, skip_special_tokens=False) == t

def test_saved_files_and_special_ids(tok_dir, tok):
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tok_dir.iterdir()}
    raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert len(tok) == raw.get_vocab_size() == 1024
    for i, t in enumerate(SPECIAL_TOKENS + CHAT_TOKENS):  # fixed ids, in order: <|eos|> is 1
        assert tok.convert_tokens_to_ids(t) == raw.token_to_id(t) == i
        assert tok(f"x{t}y", add_special_tokens=False)["input_ids"][1:-1] == [i]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert [f"<|lang={l}|>" for l in LANGS] == SPECIAL_TOKENS[6:]

def test_indentation_and_digits(tok):
    pieces = lambda s: [tok.decode([i]) for i in tok(s, add_special_tokens=False)["input_ids"]]
    p = pieces("def f():\n    if x:\n        return 1234\n")
    assert "    " in p and "        " in p            # indentation runs are whole tokens, apart from the code
    assert [t for t in p if t.strip().isdigit()] == [" 1", "2", "3", "4"]
    assert not any(t.strip().isdigit() and len(t.strip()) > 1 for t in pieces("x = [10, 200, 3000, 45678]"))

def test_chat_template(tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|user|>\nhi<|end|>\n<|assistant|>\nhello<|end|>\n"
    assert tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True) == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    out = tok.apply_chat_template(msgs, return_dict=True, return_assistant_tokens_mask=True)
    ids = out["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|user|>") and ids.count(tok.convert_tokens_to_ids("<|end|>")) == 2
    assert tok.decode([i for i, m in zip(ids, out["assistant_masks"]) if m]) == "hello<|end|>"
    with pytest.raises(Exception, match="use system, user or assistant"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)

def test_bytes_per_token(tok, corpus):
    r = bytes_per_token(tok, corpus[1])
    assert r["docs"] == len(corpus[1]) and r["bytes"] == sum(len(t.encode()) for t in corpus[1])
    assert r["tokens"] == sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in corpus[1])
    assert r["bytes_per_token"] == round(r["bytes"] / r["tokens"], 3) and 2 < r["bytes_per_token"] < 6

@pytest.mark.parametrize("tied", [True, False])
def test_extend_vocab(tok, tied):
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)).eval()
    x = torch.tensor([tok("for i in range(10):\n    print(i)\n")["input_ids"]])
    with torch.no_grad(): before = m(x).logits
    old_in = m.get_input_embeddings().weight.detach().clone()
    assert extend_vocab(tok, m, ["<|file_sep|>", "<|repo_name|>", "<|eos|>", "<|file_sep|>"]) == 2
    assert len(tok) == m.get_input_embeddings().num_embeddings == m.get_output_embeddings().weight.shape[0] == 1026
    assert m.config.vocab_size == 1026
    with torch.no_grad(): after = m(x).logits
    assert torch.equal(before, after[..., :1024])
    assert torch.equal(m.get_input_embeddings().weight[:1024], old_in)
    for w in (m.get_input_embeddings().weight, m.get_output_embeddings().weight):
        torch.testing.assert_close(w[1024:], w[:1024].mean(0, keepdim=True).expand(2, -1))
    assert (m.get_output_embeddings().weight is m.get_input_embeddings().weight) == tied
    assert tok("a<|file_sep|>b<|repo_name|>", add_special_tokens=False)["input_ids"][1::2] == [1024, 1025]
    assert extend_vocab(tok, None, ["<|file_sep|>"]) == 0  # nothing new

def read(d): return {s: (d / f"{s}.bin").read_bytes() for s in ("train", "val")}

def test_pack_window_split_and_determinism(tok, corpus, tmp_path):
    texts = corpus[1] + ["x = 1\n", None, "print('<|eos|>')\n" * 30]
    langs = ["python"] * (len(texts) - 1) + ["cobol"]
    ds = docs_ds(texts, langs)
    idx = pack_shards(ds, tok, tmp_path / "a", val_frac=0.2, min_tokens=20, max_tokens=3000, chunk_docs=25)
    n = [len(tok(t or "", add_special_tokens=False)["input_ids"]) for t in texts]
    known = [l == "python" for l in langs]
    assert idx["dropped"] == {"short": sum(k and x < 20 for k, x in zip(known, n)),
                              "long": sum(k and x > 3000 for k, x in zip(known, n)), "unknown_lang": 1}
    assert idx["dropped"]["short"] >= 2 and idx["dropped"]["long"] >= 1
    kept = [i for i, (k, x) in enumerate(zip(known, n)) if k and 20 <= x <= 3000]
    tag, eos = tok.convert_tokens_to_ids(["<|lang=python|>", "<|eos|>"])
    for split, want_val in (("train", False), ("val", True)):
        want = [i for i in kept if is_val(f"doc{i}", 0.2) == want_val]
        got = np.fromfile(tmp_path / "a" / f"{split}.bin", np.uint16)
        assert got.tolist() == sum(([tag] + tok(texts[i], add_special_tokens=False)["input_ids"] + [eos] for i in want), [])
        assert idx[split]["docs"] == len(want) and idx[split]["tokens"] == len(got)
    assert idx["val"]["docs"] > 0 and idx["chunks"] == -(-len(texts) // 25) > 1 and not (tmp_path / "a" / "chunks").exists()
    # same inputs -> same bytes, whatever the number of processes or the batch size
    b = pack_shards(ds, tok, tmp_path / "b", val_frac=0.2, min_tokens=20, max_tokens=3000, chunk_docs=25, num_proc=2, batch_size=7)
    assert read(tmp_path / "a") == read(tmp_path / "b") and b == idx
    assert json.loads((tmp_path / "a" / "index.json").read_text()) == idx

def test_literal_special_tokens_are_text(tok, tmp_path):
    text = "s = '<|eos|><|lang=rust|><|user|>'\n" * 10
    pack_shards(docs_ds([text]), tok, tmp_path, val_frac=0.0, min_tokens=1)
    ids = np.fromfile(tmp_path / "train.bin", np.uint16)
    assert ids[-1] == 1 and (ids == 1).sum() == 1 and (ids < len(SPECIAL_TOKENS + CHAT_TOKENS)).sum() == 2
    assert tok.decode(ids[1:-1].tolist()) == text

def test_pack_resume_after_interrupted_chunk(tok, corpus, tmp_path):
    ds = docs_ds(corpus[1])
    ref = pack_shards(ds, tok, tmp_path / "ref", val_frac=0.2, chunk_docs=16)
    calls = []
    def crash(i, counts):
        calls.append(i)
        if i == 2: raise RuntimeError("power cut")
    with pytest.raises(RuntimeError, match="power cut"):
        pack_shards(ds, tok, tmp_path / "run", val_frac=0.2, chunk_docs=16, on_chunk=crash)
    work = tmp_path / "run" / "chunks"
    assert sorted(p.name for p in work.glob("*.done.json")) == ["00000.done.json", "00001.done.json"]
    assert (work / "00002.train.bin").exists() and not (tmp_path / "run" / "index.json").exists()
    calls.clear()
    idx = pack_shards(ds, tok, tmp_path / "run", val_frac=0.2, chunk_docs=16, on_chunk=lambda i, c: calls.append(i))
    assert calls == [2, 3, 4] and idx == ref
    assert read(tmp_path / "run") == read(tmp_path / "ref")
    # a finished run is not redone
    mtime = (tmp_path / "run" / "train.bin").stat().st_mtime_ns
    calls.clear()
    assert pack_shards(ds, tok, tmp_path / "run", val_frac=0.2, chunk_docs=16, on_chunk=lambda i, c: calls.append(i)) == ref
    assert calls == [] and (tmp_path / "run" / "train.bin").stat().st_mtime_ns == mtime

def test_stale_chunks_are_not_reused(tok, corpus, tmp_path):
    ds = docs_ds(corpus[1])
    def crash(i, c):
        if i == 1: raise RuntimeError("stop")
    with pytest.raises(RuntimeError): pack_shards(ds, tok, tmp_path / "run", val_frac=0.2, chunk_docs=16, on_chunk=crash)
    other = pack_shards(ds, tok, tmp_path / "run", val_frac=0.5, chunk_docs=16)   # other split: chunk 0 must be redone
    assert other == pack_shards(ds, tok, tmp_path / "fresh", val_frac=0.5, chunk_docs=16)
    assert read(tmp_path / "run") == read(tmp_path / "fresh")
    again = pack_shards(ds, tok, tmp_path / "run", val_frac=0.2, chunk_docs=16)    # finished with other inputs: rebuilt
    assert again["fingerprint"] != other["fingerprint"] and again["val"]["docs"] < other["val"]["docs"]

def test_uint16_and_uint32(tmp_path):
    assert token_dtype(1024) == np.uint16 and token_dtype(2**16) == np.uint16 and token_dtype(2**16 + 1) == np.uint32
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + [f"w{i}" for i in range(70_000)])}
    wl = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    text = " ".join(f"w{i}" for i in range(65_500, 65_700))
    idx = pack_shards(docs_ds([text]), wl, tmp_path / "shards", val_frac=0.0, min_tokens=1)
    assert idx["dtype"] == "uint32" and idx["vocab_size"] == len(vocab)
    got = load_tokens(tmp_path, "train")
    assert got.dtype == np.uint32 and got[1:-1].tolist() == [vocab[w] for w in text.split()] and got.max() > 2**16

def test_bad_input_messages(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="run `codellm data`"): load_tokens(tmp_path)
    pack_shards(docs_ds(["x = 1\n" * 40]), tok, tmp_path / "shards", val_frac=0.0)
    with pytest.raises(ValueError, match="Unknown split 'test'; the shards have: train, val"): load_tokens(tmp_path, "test")
    with pytest.raises(ValueError, match="Unknown split 'dtype'"): load_tokens(tmp_path, "dtype")
    assert len(load_tokens(tmp_path, "val")) == 0 and len(load_tokens(tmp_path, "train")) > 0
    (tmp_path / "shards" / "train.bin").write_bytes(b"\0\0")
    with pytest.raises(FileNotFoundError, match="shorter than its"): load_tokens(tmp_path, "train")
    with pytest.raises(ValueError, match="missing: id, lang"): pack_shards(Dataset.from_list([{"text": "x"}]), tok, tmp_path / "y")
    bare = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    with pytest.raises(ValueError, match="no <|eos|> token"): pack_shards(docs_ds(["a"]), bare, tmp_path / "z")

def loaders(tokens, world, prefetch=2, **kw):
    return [TokenLoader(tokens, seq_len=16, micro_batch=3, rank=r, world=world, seed=7, prefetch=prefetch, **kw) for r in range(world)]

def test_loader_disjoint_ranks_and_epochs():
    tokens = np.arange(16 * 100, dtype=np.uint16)  # block b holds 16b .. 16b+15
    lds = loaders(tokens, 3)
    spe = lds[0].steps_per_epoch
    assert spe == 100 // 9
    per_epoch = {0: [], 1: []}
    for _ in range(2 * spe):
        for ld in lds:
            e, x = ld.epoch, next(ld)
            assert x.shape == (3, 16) and x.dtype == torch.int64
            assert torch.equal(x[:, 1:] - x[:, :1], torch.arange(1, 16).expand(3, -1))  # whole, aligned blocks
            per_epoch[e] += (x[:, 0] // 16).tolist()
    for e, blocks in per_epoch.items(): assert len(blocks) == len(set(blocks)) == spe * 9  # disjoint across ranks
    assert per_epoch[0] != per_epoch[1] and (lds[0].epoch, lds[0].step) == (2, 0)
    for ld in lds: ld.close()

def test_loader_resume_matches_uninterrupted():
    tokens = np.random.default_rng(0).integers(0, 1000, 16 * 50).astype(np.uint16)
    for stop in (0, 4, 15, 16, 17, 40):   # steps_per_epoch is 16: the middle, the edges and past the epoch boundary
        full = TokenLoader(tokens, 16, 3, seed=3)
        ref = [next(full) for _ in range(stop + 10)]
        a = TokenLoader(tokens, 16, 3, seed=3, prefetch=1)
        for _ in range(stop): next(a)
        for _ in range(500):                          # let the thread run ahead: the state must not follow it
            if a._thread is None or a._queue.full(): break
            time.sleep(0.01)
        state = json.loads(json.dumps(a.state_dict()))  # survives a checkpoint file
        a.close()
        b = TokenLoader(tokens, 16, 3, world=1, seed=3, prefetch=3)
        b.load_state_dict(state)
        for want in ref[stop:]: assert torch.equal(next(b), want)
        full.close(); b.close()
    sync = TokenLoader(tokens, 16, 3, seed=3, prefetch=0)
    assert all(torch.equal(next(sync), r) for r in ref) and sync._thread is None

def test_loader_state_checks_and_messages():
    tokens = np.zeros(16 * 20, np.uint16)
    a = TokenLoader(tokens, 16, 2, rank=0, world=2)
    with pytest.raises(ValueError, match="world 4 .now 2.*same data and settings"): a.load_state_dict(dict(a.state_dict(), world=4))
    with pytest.raises(ValueError, match="n_blocks 30 .now 20."): a.load_state_dict(dict(a.state_dict(), n_blocks=30))
    with pytest.raises(ValueError, match="fewer than one global batch"): TokenLoader(tokens[:40], 16, 2, world=2)
    with pytest.raises(ValueError, match="rank must be in"): TokenLoader(tokens, 16, 2, rank=2, world=2)

def test_prefetch_thread_stops_cleanly():
    tokens = np.arange(16 * 40, dtype=np.uint16)
    before = threading.active_count()
    with TokenLoader(tokens, 16, 2, prefetch=2) as ld:
        next(ld); t = ld._thread
        assert t.is_alive() and t.daemon
    assert not t.is_alive() and ld._thread is None and threading.active_count() == before
    x = next(ld); ld.close()                          # iterating again restarts it where it stopped
    assert ld.state_dict()["step"] == 2 and x.shape == (2, 16)

    class Broken:                                     # a read error in the thread reaches the training loop
        def __len__(self): return 16 * 40
        def __getitem__(self, s):
            if s.start >= 16 * 20: raise OSError("disk gone")
            return tokens[s]
    ld = TokenLoader(Broken(), 16, 2, prefetch=2)
    with pytest.raises(OSError, match="disk gone"):
        for _ in range(100): next(ld)
    assert ld._thread is None and threading.active_count() == before

# Generated inputs (hypothesis): text nobody chose, documents cut into chunks at every place, shard borders, resume points.
from hypothesis import given, settings, strategies as st
from conftest import examples
from codellm_nb.tokenizer import ShardedTokens

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300) | st.sampled_from(ODD) | \
       st.lists(st.sampled_from(["<|eos|>", "<|user|>", "<|lang=go|>", "    ", "\t", "\r\n", "def", "x", "é", "🙂", "\x00"]),
                max_size=30).map("".join)

@pytest.fixture(scope="module")
def fast(tok_dir):
    "The backend tokenizer, encoding special-token text as text (as packing does)."
    bt = Tokenizer.from_file(str(tok_dir / "tokenizer.json")); bt.encode_special_tokens = True
    return bt

@pytest.mark.generated
@given(text=TEXT)
@settings(**examples(200))
def test_any_text_round_trips(fast, text):
    assert fast.decode(fast.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text

def reference_pack(docs:list[dict], bt, val_frac:float, lo:int, hi:int|None) -> dict:
    "What `pack_shards` must write, the simplest way: each kept document as [tag] + ids + [eos], split by id, in order."
    vocab, out = bt.get_vocab(with_added_tokens=True), {"train": [], "val": []}
    for d in docs:
        ids, tag = bt.encode(d["text"], add_special_tokens=False).ids, vocab.get(f"<|lang={d['lang']}|>")
        if tag is None or len(ids) < lo or hi is not None and len(ids) > hi: continue
        out["val" if is_val(d["id"], val_frac) else "train"] += [tag, *ids, vocab["<|eos|>"]]
    return out

DOC = st.fixed_dictionaries(dict(text=TEXT, lang=st.sampled_from([*LANGS, "cobol"])))

@pytest.mark.generated
@given(docs=st.lists(DOC, min_size=1, max_size=25), chunk=st.integers(1, 10), lo=st.integers(0, 20),
       hi=st.none() | st.integers(20, 200), val=st.sampled_from([0.0, 0.3, 1.0]))
@settings(**examples(12))
def test_packing_writes_what_a_plain_loop_writes(fast, tok, tmp_path_factory, docs, chunk, lo, hi, val):
    "Chunk borders anywhere (resumable chunks of `chunk` documents), every window and split: the same token streams."
    docs = [dict(d, id=f"d{i}") for i, d in enumerate(docs)]
    out = tmp_path_factory.mktemp("pack")
    index = pack_shards(Dataset.from_list(docs), tok, out, val_frac=val, min_tokens=lo, max_tokens=hi, chunk_docs=chunk)
    want = reference_pack(docs, fast, val, lo, hi)
    for s in ("train", "val"):
        assert np.fromfile(out / f"{s}.bin", dtype=index["dtype"]).tolist() == want[s], s
        assert index[s]["tokens"] == len(want[s])

@pytest.mark.generated
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6), data=st.data())
@settings(**examples(100))
def test_sharded_tokens_read_as_their_concatenation(sizes, data):
    "Slices across any shard borders (empty shards too), indexing from either end, len, max: as one numpy array."
    rng = np.random.default_rng(len(sizes))
    parts = [rng.integers(0, 60000, n).astype(np.uint16) for n in sizes]
    whole, sharded = np.concatenate(parts), ShardedTokens(parts, np.uint16)
    assert len(sharded) == len(whole) and np.array_equal(np.asarray(sharded), whole)
    if len(whole):
        a = data.draw(st.integers(-len(whole) - 5, len(whole) + 5)); b = data.draw(st.integers(-len(whole) - 5, len(whole) + 5))
        assert np.array_equal(sharded[a:b], whole[a:b]) and sharded.max() == whole.max()
        i = data.draw(st.integers(-len(whole), len(whole) - 1))
        assert sharded[i] == whole[i]

@pytest.mark.generated
@given(n_blocks=st.integers(2, 60), seq=st.sampled_from([1, 4, 16]), micro=st.integers(1, 4), world=st.integers(1, 3),
       stop=st.integers(0, 80), prefetch=st.integers(0, 3))
@settings(**examples(40))
def test_the_loader_resumed_anywhere_continues_as_if_never_stopped(n_blocks, seq, micro, world, stop, prefetch):
    "Every rank, stopped after any step (epoch boundaries included) and restored from its state: the same batches."
    tokens = np.random.default_rng(n_blocks).integers(0, 500, n_blocks * seq + 3).astype(np.uint16)
    if n_blocks // (micro * world) == 0: return  # fewer blocks than one global batch: refused, tested above
    for rank in range(world):
        full = TokenLoader(tokens, seq, micro, rank=rank, world=world, seed=1, prefetch=0)
        ref = [next(full) for _ in range(stop + 5)]
        a = TokenLoader(tokens, seq, micro, rank=rank, world=world, seed=1, prefetch=prefetch)
        for _ in range(stop): next(a)
        state = json.loads(json.dumps(a.state_dict())); a.close()
        b = TokenLoader(tokens, seq, micro, rank=rank, world=world, seed=1, prefetch=prefetch)
        b.load_state_dict(state)
        assert all(torch.equal(next(b), r) for r in ref[stop:])
        b.close()
