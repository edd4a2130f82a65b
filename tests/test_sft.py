"Instruction variants, renaming, checks, mixture, DPO pairs executed in the sandbox, and self-instruct against the project's server."
import ast, random
from concurrent.futures import ProcessPoolExecutor
import pytest
from codellm_nb.sources import read_code, stdlib_files
from codellm_nb.sandbox import run_program
from codellm_nb.testing import canned_chat_model
from codellm_nb.sft import (FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, SFT_INSTRUCTION, TASKS, code_completion,
                            code_to_docstring, doctest_candidates, doctest_program, docstring_to_code, extract_functions,
                            fim_parse, fim_sample, fim_split, instruction_records, merge_stats, mix_records, mutants,
                            parse_self_instruct, preference_pairs, rename_locals, self_instruct, self_instruct_prompts,
                            sft_prompt, sft_records, to_context_response, unittest_from_doctests, unittest_program,
                            verify_records)
from codellm_nb.serve import start_server

MODULE = '''import math

def gcd(a, b):
    """Greatest common divisor of two non-negative integers.

    Examples:

    >>> gcd(12, 18)
    6
    >>> gcd(7, 0)
    7
    >>> gcd(-1, 2)
    Traceback (most recent call last):
    ...
    ValueError: negative input
    """
    if a < 0 or b < 0:
        raise ValueError("negative input")
    while b:
        a, b = b, a % b
    return a

def hypot(x, y):
    """Length of the vector (x, y).

    >>> hypot(3, 4)
    5.0
    """
    return math.sqrt(x * x + y * y)
'''

def fn(name, text=MODULE):
    return next(f for f in extract_functions(text)[0] if f["name"] == name)

def outcome(program):
    "What a doctest program did in the sandbox: passed, or how many examples failed."
    r = run_program(program)
    return "passed" if r["passed"] else r["stdout"].split("DOCTEST ")[-1].split("\n")[0] or r["result"]

# ---- variants on a known function

def test_docstring_to_code_and_back():
    rec, why = docstring_to_code(fn("gcd"))
    assert why is None and rec["task"] == "docstring_to_code" and rec["instruction"] == SFT_INSTRUCTION
    assert rec["input"].startswith("def gcd(a, b):\n") and rec["input"].endswith('    """\n')
    assert rec["output"] == "    if a < 0 or b < 0:\n        raise ValueError(\"negative input\")\n    while b:\n        a, b = b, a % b\n    return a\n"
    assert sft_prompt(rec) == f"<|lang=python|># {SFT_INSTRUCTION}\n" + rec["input"]
    rec, _ = code_to_docstring(fn("hypot"))
    assert rec["input"] == "def hypot(x, y):\n    return math.sqrt(x * x + y * y)\n"
    assert rec["output"] == "Length of the vector (x, y).\n\n>>> hypot(3, 4)\n5.0\n"

def test_completion_cuts_at_statements():
    f = fn("gcd")
    cuts = set()
    for s in range(30):
        rec, _ = code_completion(f, random.Random(s))
        assert rec["input"] + rec["output"] == f["src"]
        last = rec["input"].rstrip("\n").split("\n")[-1]
        cuts.add(rec["output"].split("\n")[0].strip())
        assert '"""' not in rec["output"] and last.strip()  # after the docstring, never on a blank line
    assert cuts == {"raise ValueError(\"negative input\")", "while b:", "a, b = b, a % b", "return a"}

def test_unittest_from_doctests_runs_against_the_function():
    rec, why = unittest_from_doctests(fn("gcd"))
    assert why is None and rec["input"].startswith("def gcd(a, b):\n")  # gcd does not use math: no import
    assert unittest_from_doctests(fn("hypot"))[0]["input"].startswith("import math\n\n\ndef hypot(x, y):\n")
    assert ">>>" not in rec["input"] and "Examples" not in rec["input"] and "Greatest common divisor" in rec["input"]
    assert "self.assertEqual(gcd(12, 18), 6)" in rec["output"] and "with self.assertRaises(ValueError):" in rec["output"]
    assert run_program(rec["check"])["passed"]
    wrong = rec["output"].replace("gcd(12, 18), 6", "gcd(12, 18), 4")
    assert not run_program(unittest_program(rec["input"], wrong))["passed"]

def test_every_task_compiles_and_counts(tmp_path):
    recs, st = instruction_records(MODULE)
    assert st["records"] == {"docstring_to_code": 2, "code_to_docstring": 2, "completion": 1, "fim": 2, "unittest": 2}
    assert st["skipped"]["completion"] == {"too_short": 1}
    assert {r["task"] for r in recs} == set(TASKS)
    for r in recs:
        assert set(r) >= {"instruction", "input", "output", "task", "aug"}
        assert ("check" in r) == (r["task"] == "unittest")
    with pytest.raises(ValueError, match="choose from"): instruction_records(MODULE, tasks=("essay",))

def test_sft_records_keep_their_old_shape():
    example = 'class A:\n    def area(self, r):\n        """Area of a circle of radius r."""\n        return 3.14159 * r * r\n\ndef bare():\n    """Only a docstring."""\n'
    recs = sft_records(example)
    assert [(r["input"], r["output"]) for r in recs] == [('def area(self, r):\n    """Area of a circle of radius r."""\n', "    return 3.14159 * r * r\n")]
    assert sft_records("def broken(:\n") == []

# ---- FIM

def test_fim_is_deterministic_and_reassembles():
    texts = [t for t, _ in (read_code(p) for p in stdlib_files(20)) if t]
    fns = [f for t in texts for f in extract_functions(t)[0]][:200]
    assert len(fns) == 200
    for f in fns:
        a, _ = fim_sample(f, random.Random(7))
        b, _ = fim_sample(f, random.Random(7))
        assert a == b
        assert a["input"].startswith(FIM_PREFIX) and a["input"].endswith(FIM_MIDDLE) and FIM_SUFFIX in a["input"]
        pre, mid, suf = fim_parse(a["input"], a["output"])
        assert pre + mid + suf == f["src"] and mid
    spans = {fim_split("abcdefghij", random.Random(s)) for s in range(50)}
    assert len(spans) > 20 and all("".join(s) == "abcdefghij" and s[1] for s in spans)
    with pytest.raises(ValueError): fim_split("", random.Random(0))
    recs_a, _ = instruction_records(texts[0], seed=3)
    recs_b, _ = instruction_records(texts[0], seed=3)
    recs_c, _ = instruction_records(texts[0], seed=4)
    assert recs_a == recs_b and [r for r in recs_a if r["task"] == "fim"] != [r for r in recs_c if r["task"] == "fim"]

# ---- renaming

RENAME = '''def tally(self, items, *, scale=1):
    """Weighted counts, also stored on `self`."""
    counts = {}
    for item in items:
        weight = WEIGHTS.get(item, 1) * scale
        counts[item] = counts.get(item, 0) + weight
    self.counts = counts
    total = sum(counts.values())
    return sorted(counts.items(), key=lambda kv: -kv[1]), total
'''

def test_rename_locals_keeps_behaviour_and_leaves_globals_alone():
    new, mapping = rename_locals(RENAME, seed=1)
    assert set(mapping) == {"items", "scale", "item", "weight", "total"}  # not `counts` (the docstring says it), nor `self`
    tree = ast.parse(new)
    assert "WEIGHTS" in new and "self.counts" in new and ".get(" in new and "key=lambda kv" in new
    assert all(n.id not in mapping for n in ast.walk(tree) if isinstance(n, ast.Name))
    assert {a.attr for a in ast.walk(tree) if isinstance(a, ast.Attribute)} == {a.attr for a in ast.walk(ast.parse(RENAME)) if isinstance(a, ast.Attribute)}
    class Obj: pass
    for scale in (1, 3):
        for items in (["a", "b", "a"], [], list("mississippi")):
            before, after = {"WEIGHTS": {"a": 2, "s": 5}}, {"WEIGHTS": {"a": 2, "s": 5}}
            exec(RENAME, before); exec(new, after)
            o1, o2 = Obj(), Obj()
            new_scale = mapping.get("scale", "scale")
            assert before["tally"](o1, items, scale=scale) == after["tally"](o2, items, **{new_scale: scale})
            assert o1.counts == o2.counts

def test_rename_locals_refuses_what_it_cannot_rename_safely():
    closure = "def f(xs):\n    n = 0\n    def inc():\n        nonlocal n\n        n += 1\n    for x in xs:\n        inc()\n    return n\n"
    new, mapping = rename_locals(closure)
    assert set(mapping) == {"xs", "x"}  # not n (shared with the closure through nonlocal), nor inc (a nested def)
    assert rename_locals("def f(a):\n    b = a\n    return eval('b')\n") == (None, "dynamic_scope")
    new, mapping = rename_locals('def f(path):\n    "Open `path`."\n    size = len(path)\n    return f"{size}"\n')
    assert new is None and mapping == "nothing_to_rename"  # path: in the docstring; size: in an f-string
    new, mapping = rename_locals("def f(a, b=None):\n    try:\n        c = a / b\n    except ZeroDivisionError as e:\n        c = e\n    return c\n")
    assert "e" not in mapping and compile(new, "<t>", "exec")

def test_augmented_records_compile_and_doctests_still_pass():
    recs, st = instruction_records(MODULE, augment=True)
    aug = [r for r in recs if r["aug"] == "rename_locals"]
    assert st["augmented"]["docstring_to_code"] == 1 and all("check" in r for r in aug)
    assert st["skipped"]["rename_locals"] == {"nothing_to_rename": 1}  # hypot: its docstring names x and y
    kept, vst = verify_records(recs)
    assert vst["failed"] == {} and len(kept) == len(recs) and not any("check" in r for r in kept)
    gcd_aug = next(r for r in aug if r["task"] == "docstring_to_code" and "gcd" in r["input"])
    assert gcd_aug["input"].startswith("def gcd(")
    broken = dict(gcd_aug, check=doctest_program(gcd_aug["input"] + gcd_aug["output"].replace("%", "//", 1), "gcd"))
    assert verify_records([broken])[1]["failed"] == {"docstring_to_code+rename_locals": 1}

def test_instruction_records_run_in_worker_processes():
    texts = [t for t, _ in (read_code(p) for p in stdlib_files(6)) if t]
    with ProcessPoolExecutor(2) as ex: par = list(ex.map(instruction_records, texts))
    assert par == [instruction_records(t) for t in texts]
    st = merge_stats(*(s for _, s in par))
    assert st["functions"] == sum(s["functions"] for _, s in par) and sum(st["records"].values()) == sum(len(r) for r, _ in par)

# ---- mixture

def test_mix_records_dedupes_and_caps():
    recs = [dict(instruction="i", input=f"x{i}", output="y", task="fim", aug="") for i in range(100)]
    recs += [dict(instruction="i", input=f"u{i}", output="y", task="unittest", aug="") for i in range(5)]
    recs += [dict(instruction="i", input=f"d{i}", output="y", task="docstring_to_code", aug="") for i in range(30)]
    recs += [dict(recs[0], output="y  \n")]  # a duplicate up to trailing whitespace
    mixed, st = mix_records(recs, max_share=0.5)
    assert st["duplicates"] == 1 and st["kept"] == {"docstring_to_code": 30, "fim": 35, "unittest": 5}
    assert max(st["kept"].values()) <= 0.5 * len(mixed)
    assert mix_records(recs[::-1], max_share=0.5)[0] == mixed
    assert to_context_response(recs[0]) == {"context": "i\n\nx0", "response": "y"}
    with pytest.raises(ValueError, match="verify_records"): mix_records([dict(recs[0], check="x")])

# ---- preference pairs, executed

CANDIDATES = MODULE + '''
def wrong_doc(x):
    """Doubles.

    >>> wrong_doc(2)
    5
    """
    return 2 * x

def shout(s):
    """Print `s` in capitals.

    >>> shout("hi")
    HI
    """
    print(s.upper())

def uses_const(x):
    """
    >>> uses_const(1)
    11
    """
    return x + OFFSET

from .sibling import helper

def uses_relative(x):
    """
    >>> uses_relative(1)
    1
    """
    return helper(x)

class K:
    def meth(self):
        """
        >>> K().meth()
        1
        """
        return 1
'''

def test_preference_pairs_are_verified_and_skips_are_counted():
    cands, cst = doctest_candidates(CANDIDATES)
    assert [c["name"] for c in cands] == ["gcd", "hypot", "wrong_doc", "shout"]
    assert cst == {"functions_with_doctests": 7, "skipped": {"needs_module_context": 1, "relative_import": 1, "method": 1}}
    pairs, st = preference_pairs(cands, workers=2, max_tries=6)
    assert st["skipped"] == {"fails_as_written": 1, "no_mutation_site": 1}  # wrong_doc's doctest is wrong; shout has nothing to mutate
    assert st["pairs"] == 2 == len(pairs) and sum(st["mutations"].values()) == 2
    assert cst["functions_with_doctests"] == st["pairs"] + sum(cst["skipped"].values()) + sum(st["skipped"].values())
    by_name = {c["name"]: c for c in cands}
    for p in pairs:
        assert set(p) == {"prompt", "instruction", "input", "chosen", "rejected", "mutation"} and p["chosen"] != p["rejected"]
        c = next(c for n, c in by_name.items() if f"def {n}(" in p["prompt"])
        head = docstring_to_code(c)[0]["input"]
        assert p["prompt"] == sft_prompt(dict(instruction=SFT_INSTRUCTION, input=head))
        assert outcome(doctest_program(head + p["chosen"], c["name"], c["imports"])) == "passed"
        failed, attempted = outcome(doctest_program(head + p["rejected"], c["name"], c["imports"])).split()
        assert int(failed) >= 1 and int(attempted) >= 1

def test_every_mutant_changes_the_body_only():
    f = fn("gcd")
    ms = mutants(f["src"])
    kinds = {k for k, _ in ms}
    assert kinds == {"flip_comparison", "off_by_one", "swap_and_or", "negate_condition", "drop_return_value", "swap_operands"}
    head = docstring_to_code(f)[0]["input"]
    for k, m in ms:
        assert m != f["src"] and m.startswith(head) and compile(m, "<m>", "exec")
    assert dict(mutants("def f(n):\n    return [i for i in range(n)]\n"))["range_bound"] == "def f(n):\n    return [i for i in range(n + 1)]\n"
    assert dict(mutants("def f(a, b):\n    return a and b\n"))["swap_and_or"] == "def f(a, b):\n    return a or b\n"
    assert mutants(f["src"], seed=1) != ms and sorted(mutants(f["src"], seed=1)) == sorted(ms)

# ---- self-instruct against the project's server

SEEDS = [dict(instruction=SFT_INSTRUCTION, input='def add(a, b):\n    """Sum of a and b."""\n', output="    return a + b\n", task="docstring_to_code", aug=""),
         dict(instruction=SFT_INSTRUCTION, input='def neg(x):\n    """Minus x."""\n', output="    return -x\n", task="docstring_to_code", aug="")]
REPLY_1 = ('### Task\n```python\ndef square(x):\n    """The square of `x`."""\n```\n### Solution\n```python\n    return x * x\n```\n\n'
           '### Task\ndef add(a, b):\n    """Sum of a and b."""\n### Solution\n    return b + a\n\n'
           '### Task\ndef oops(x:\n    """Broken."""\n### Solution\n    return x\n')
REPLY_2 = ('### Task\ndef square(x):\n    """The square of `x`."""\n### Solution\n    return x * x\n\n'
           '### Task\ndef cube(x):\n    """The cube of `x`."""\n### Solution\n    return x ** 3\n\n'
           '### Task\ndef long(x):\n    """Return x unchanged.\n\n    This docstring goes on: it explains the identity function, why one might\n'
           '    want it, where it helps in functional code, and how it differs from copying.\n    """\n### Solution\n    return x\n')

def test_parse_self_instruct_filters():
    seen = {" ".join((r["input"] + r["output"]).split()) for r in SEEDS}
    heads = {" ".join(r["input"].split()) for r in SEEDS}
    recs, why = parse_self_instruct(REPLY_1, seen, heads, max_chars=200)
    assert [r["input"] for r in recs] == ['def square(x):\n    """The square of `x`."""\n']
    assert recs[0]["output"] == "    return x * x\n" and recs[0]["task"] == "self_instruct"
    assert why == {"duplicate_of_seed": 1, "syntax_error": 1}
    recs, why = parse_self_instruct(REPLY_2, seen, heads, max_chars=200)
    assert [r["input"].split("(")[0] for r in recs] == ["def cube"] and why == {"duplicate": 1, "too_long": 1}
    assert parse_self_instruct("no tasks here")[1] == {"no_task_found": 1}
    no_doc = "### Task\ndef identity_function(x):\n    return x\n### Solution\n    return x\n"
    assert parse_self_instruct(no_doc)[1] == {"not_signature_and_docstring": 1}

def test_self_instruct_against_the_server(tmp_path):
    prompts = self_instruct_prompts(SEEDS, n=2, shots=2)
    model = canned_chat_model([(prompts[0], REPLY_1), (prompts[1], REPLY_2)], tmp_path / "canned")
    with start_server(model, api_key="k", name="canned") as url:
        recs, st = self_instruct(url, "k", "canned", SEEDS, n=2, shots=2, temperature=0, max_chars=200)
        with pytest.raises(RuntimeError, match="check base_url, api_key and model"):
            self_instruct(url, "wrong-key", "canned", SEEDS, n=1)
    assert [r["input"].split("(")[0] for r in recs] == ["def square", "def cube"]
    assert st == {"requests": 2, "errors": 0, "kept": 2,
                  "filtered": {"duplicate_of_seed": 1, "syntax_error": 1, "duplicate": 1, "too_long": 1}}
    with pytest.raises(ValueError, match="sft_records"): self_instruct_prompts([dict(SEEDS[0], task="fim")])

def test_several_pairs_per_function_each_reject_a_different_failing_mutant():
    cands, _ = doctest_candidates(CANDIDATES)
    pairs, st = preference_pairs(cands, workers=2, max_tries=8, per_function=3)
    per_fn = {}
    for p in pairs: per_fn[p["input"]] = per_fn.get(p["input"], 0) + 1
    assert st["pairs"] == len(pairs) > 2 and max(per_fn.values()) <= 3 and len(per_fn) == 2
    assert len({(p["input"], p["rejected"]) for p in pairs}) == len(pairs)
