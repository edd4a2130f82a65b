"Language detection, cleaning, quality filters and redaction on labelled cases and the whole standard library."
import ast, pickle, re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
import pytest
from codellm_nb.core import LANGS
from codellm_nb.sources import read_code, stdlib_files
from codellm_nb.sources import EXTENSIONS
from codellm_nb.filters import (PLACEHOLDERS, QualityThresholds, clean_text, detect_language, filter_document,
                                filter_stats, find_secrets, is_placeholder, is_redactable_ip, quality_problem, redact,
                                score_redaction)
from codellm_nb.testing import LANGUAGE_CASES, QUALITY_CASES, REDACTION_CASES, fake_token

@pytest.fixture(scope="module")
def stdlib():
    return [(p, t) for p in stdlib_files() if (t := read_code(p, 10**6)[0]) is not None]

# ---- language detection
def test_every_language_has_extensions():
    assert set(EXTENSIONS) == set(LANGS)

def test_language_cases():
    assert all(detect_language(name, src) == lang for lang, name, src in LANGUAGE_CASES)
    by_content = [detect_language(None, src) == lang for lang, _, src in LANGUAGE_CASES]
    assert sum(by_content) >= 0.95 * len(LANGUAGE_CASES)

@pytest.mark.parametrize("path,text,lang", [
    ("a.pyi", "", "python"), ("Main.JAVA", "", "java"), ("k.cu", "", "cpp"), ("x.cjs", "", "javascript"), ("y.mts", "", "typescript"),
    (".zshrc", "", "shell"), ("notes.md", "", None), ("data.json", "{}", None),
    ("run", "#!/usr/bin/env python3.12\nprint(1)\n", "python"), ("run", "#!/bin/dash\necho\n", "shell"),
    ("run", "#!/usr/bin/env -S node --no-warnings\n", "javascript"), ("run", "#!/usr/bin/env ts-node\n", "typescript"),
    ("run", "#!/usr/bin/perl\nprint 1;\n", None),                      # an interpreter we do not cover, too little content
    ("main.rs", "#![no_std]\nfn main() {}\n", "rust"),                  # `#![` is a Rust attribute, not a shebang
    ("x.h", "#ifndef X_H\n#define X_H\nint f(int);\n#endif\n", "c"),
    ("x.h", "#ifdef __cplusplus\nextern \"C\" {\n#endif\nint f(int);\n", "c"),
    ("x.h", "#pragma once\n#include <vector>\nstd::vector<int> f();\n", "cpp"),
    ("x.h", "// this class is virtual memory { }\nint f(void);\n", "c"),   # C++ words in a comment
    ("x.h", "#pragma once\nnamespace a { int f(); }\n", "cpp"),
    ("x.h", "void g() { c10::irange(3); }\n", "cpp"),
    ("vector", "// -*- C++ -*-\n#pragma once\n", "cpp"),              # modeline
    ("script", "echo hi\n# vim: set ft=sh:\n", "shell"),
    ("noext", "", None), (None, "", None),
])
def test_detect_language(path, text, lang):
    assert detect_language(path, text) == lang

def test_detect_language_pathological_inputs_finish():
    for text in ["a" * 200_000, " \t\n" * 50_000, "a:" * 100_000, "<" * 100_000, "x = (" * 40_000]:
        assert detect_language(None, text) in (None, *LANGS)

# ---- cleaning
def test_clean_line_endings_and_final_newline():
    assert clean_text("a\r\nb\rc  \n\n\n") == "a\nb\nc\n"
    assert clean_text("\ufeff\n\nx = 1") == "x = 1\n"
    assert clean_text("") == "" and clean_text(" \r\n\t\n") == ""

def test_clean_keeps_tabs_outside_python():
    make = "build:\n\tcc -o app main.c   \n\t@echo done\n"
    assert clean_text(make, None, "Makefile") == "build:\n\tcc -o app main.c\n\t@echo done\n"
    assert clean_text(make, "python", "GNUmakefile") == clean_text(make, None, "Makefile")
    go = "package main\n\nfunc main() {\n\tif true {\n\t\tprintln(1)\n\t}\n}\n"
    assert clean_text(go, "go", "main.go") == go
    heredoc = "cat <<-EOF\n\t\tindented\n\tEOF\n"
    assert clean_text(heredoc, "shell") == heredoc
    assert clean_text("echo a\\  \n", "shell") == "echo a\\  \n"  # an escaped space stays

def test_clean_python_tabs_keep_meaning():
    src = "class A:\n\tdef f(self):\n\t\treturn '''a\n\tb  \n'''\n\tx = 1\n"
    out = clean_text(src, "python")
    assert out == "class A:\n        def f(self):\n                return '''a\n\tb  \n'''\n        x = 1\n"
    assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(src))
    assert clean_text("def f(:\n\tpass  \n", "python") == "def f(:\n\tpass\n"  # invalid Python: tabs stay

def test_clean_stdlib_same_ast_and_idempotent(stdlib):
    for p, t in stdlib:
        tabbed = re.sub(r"(?m)^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), t)
        for src in (t, tabbed):
            out = clean_text(src, "python", p)
            assert clean_text(out, "python", p) == out, p
            try: tree = ast.dump(ast.parse(src))
            except SyntaxError: continue
            assert ast.dump(ast.parse(out)) == tree, p

# ---- quality filters
def test_quality_cases():
    for reason, path, text in QUALITY_CASES:
        assert quality_problem(text, None, path) == reason, path

def test_quality_thresholds():
    three = "a = 1\nb = 2\nc = 3\n"
    assert quality_problem(three) is None
    assert quality_problem(three, min_lines=4) == "too_few_lines"
    assert quality_problem(three, thresholds=QualityThresholds(min_lines=4)) == "too_few_lines"
    assert quality_problem(three, thresholds={"max_mean_line_length": 3}) == "mean_line_length"
    assert quality_problem("x" * 20 + "\n" + three, max_line_length=10) == "max_line_length"
    with pytest.raises(ValueError, match="min_alnum_fraction must be >= 0"): QualityThresholds(min_alnum_fraction=-0.1)
    with pytest.raises(TypeError): quality_problem(three, max_lines=3)

def test_quality_generated_markers():
    body = "\nimport os\nx = 1\ny = 2\n"
    for header in ["# DO NOT EDIT", "// Code generated by protoc-gen-go. DO NOT EDIT.", "# @generated", "/* Auto-generated file */",
                   "# This file is automatically generated", "# Generated by Django 5.0 on 2024-02-01"]:
        assert quality_problem(header + body) == "generated", header
    for header in ["# the tokens generated by the lexer", "# generated with care", '"""Values generated from the table."""']:
        assert quality_problem(header + body) is None, header
    assert quality_problem("x = 1\n" * 40 + "# DO NOT EDIT\n") is None  # only the header counts

def test_quality_keeps_stdlib(stdlib):
    verdicts = Counter(quality_problem(clean_text(t, "python"), "python", p) for p, t in stdlib)
    assert verdicts[None] >= 0.95 * len(stdlib)
    assert set(verdicts) <= {None, "generated", "too_few_lines"}

# ---- redaction
def test_redaction_recall_and_false_positives():
    rows = {r["type"]: r for r in score_redaction(REDACTION_CASES)}
    assert set(rows) == set(PLACEHOLDERS) | {"negative"}
    assert len(REDACTION_CASES) >= 80
    for kind in PLACEHOLDERS: assert rows[kind]["cases"] >= 8 and rows[kind]["recall"] >= 0.95, rows[kind]
    assert rows["negative"]["cases"] >= 40 and rows["negative"]["false_positives"] == 0, rows["negative"]["wrong"]

def test_redaction_exact_and_idempotent():
    for kind, secret, text in REDACTION_CASES:
        out, counts = redact(text)
        assert out == (text.replace(secret, PLACEHOLDERS[kind]) if kind else text), text
        assert counts == (Counter({kind: 1}) if kind else Counter())
        assert redact(out) == (out, Counter())

def test_redaction_scores_can_fail():
    cases = [("PASSWORD", "p4ss-word-1", 'password = "p4ss-word-1"'), ("EMAIL", "a@example.com", "to = 'a@example.com'"),
             (None, None, "ip = '10.2.3.4'")]
    rows = {r["type"]: r for r in score_redaction(cases)}
    assert rows["PASSWORD"]["recall"] == 1 and rows["EMAIL"]["recall"] == 0 and rows["negative"]["false_positives"] == 1
    with pytest.raises(ValueError, match="must occur in the text"): score_redaction([("EMAIL", "a.b@gmail.com", "x = 1")])

def test_redaction_details():
    assert is_redactable_ip("10.0.0.7") and is_redactable_ip("2a00:1450::1234")
    assert not any(map(is_redactable_ip, ["127.0.0.1", "0.0.0.0", "::1", "255.255.255.0", "192.0.2.4", "224.0.0.251", "1.2.3.4", "x"]))
    assert all(map(is_placeholder, ["", "****", "${PASS}", "<password>", "YOUR_TOKEN", "%(pw)s", "{password}", "None", "changeme"]))
    assert not any(map(is_placeholder, ["hunter2", "s3cr3t!", "x9$k2"]))
    text = f'url = "https://bob:{"pw" + "123"}@{"10.9.8.7"}/x"  # bob@corp.io'
    assert [k for *_, k in find_secrets(text)] == ["PASSWORD", "IP_ADDRESS", "EMAIL"]
    key = fake_token("ghp_", 36)
    assert key == fake_token("ghp_", 36) != fake_token("ghp_", 36, seed=1) and len(key) == 40

def test_redaction_long_lines():
    line = "password = 'abc123' " * 5000
    assert redact(line)[1] == Counter(PASSWORD=5000)
    assert redact("10.1.2.3 " * 5000)[1] == Counter(IP_ADDRESS=5000)
    assert redact("password=" * 20000)[1] == Counter()

def test_redaction_stdlib_keeps_code(stdlib):
    placeholder = re.compile("|".join(PLACEHOLDERS.values()))
    total = Counter()
    for p, t in stdlib:
        out, counts = redact(t)
        total += counts
        a, b = t.split("\n"), out.split("\n")
        assert len(a) == len(b) and all(x == y for x, y in zip(a, b) if not placeholder.search(y)), p
        assert redact(out) == (out, Counter()), p
    assert not {"KEY", "PRIVATE_KEY"} & set(total) and sum(total.values()) < 0.5 * len(stdlib)

# ---- one document at a time
def test_filter_document_reasons_and_stats():
    token = fake_token("ghp_", 36)
    docs = [(b"\x00", "a.bin"), ("text\n", "notes.txt"), ("x = 1\n", "tiny.py"), ("a\nb\nc\n", "yarn.lock"),
            (f"#!/bin/bash\r\nexport GH_TOKEN={token}\r\ncd /srv\r\n./run.sh\r\n", "deploy"),
            ("package main\n\nfunc main() {\n\tprintln(1)\n}\n", "main.go")]
    results = [filter_document(t, p) for t, p in docs]
    assert [i["drop"] for _, i in results] == ["not_text", "unknown_language", "too_few_lines", "unknown_language", None, None]
    assert filter_document("a\nb\nc\n", "yarn.lock", lang="shell")[1]["drop"] == "lockfile"
    assert results[4][0] == "#!/bin/bash\nexport GH_TOKEN=<KEY>\ncd /srv\n./run.sh\n"
    assert results[4][1] == dict(lang="shell", drop=None, cleaned=True, redacted={"KEY": 1})
    assert results[5][0] == docs[5][0]
    assert filter_document(docs[4][0], "deploy", redact_secrets=False)[0].count(token) == 1
    stats = filter_stats(i for _, i in results)
    assert stats == dict(documents=6, kept=2, dropped={"not_text": 1, "unknown_language": 2, "too_few_lines": 1},
                         languages={"shell": 1, "go": 1}, cleaned=1, redacted={"KEY": 1})

def test_filters_run_in_worker_processes(stdlib):
    fns = (filter_document, detect_language, clean_text, quality_problem, redact, find_secrets, filter_stats)
    assert all(pickle.loads(pickle.dumps(f)) is f for f in fns)
    docs = [t for _, t in stdlib[:40]]
    with ProcessPoolExecutor(2) as ex: par = list(ex.map(filter_document, docs, [p for p, _ in stdlib[:40]]))
    assert par == [filter_document(t, p) for p, t in stdlib[:40]]
