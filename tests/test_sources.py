"Sources and licences: bad files in a tree, row formats, SPDX expressions, real licence metadata, errors."
import functools, gzip, importlib, importlib.metadata, json, os, pickle, shutil, tempfile
from collections import Counter
from pathlib import Path
import pytest
from codellm_nb.sources import (PERMISSIVE, check_sources, code_lang, default_sources, detect_license_text, dist_license,
                                file_license, license_allowed, list_items, load_documents, load_item, normalize_license,
                                read_code, sample_items, tally_documents)

IS_ROOT = os.geteuid() == 0
MIT = "Copyright (c) 2024 Ann\n\nPermission is hereby granted, free of charge, to any person obtaining a copy\nof this software.\n"
GOOD = {"src/app.py": "def f():\n    return 1\n", "src/Main.java": "class Main {}\n", "src/lib.c": "int f(void) { return 0; }\n",
        "src/lib.cpp": "int g() { return 1; }\n", "src/main.go": "package main\n", "web/app.js": "export const a = 1;\n",
        "web/app.ts": "export const b: number = 2;\n", "src/lib.rs": "fn main() {}\n", "scripts/run.sh": "echo hi\n",
        "scripts/deploy": "#!/usr/bin/env bash\necho deploy\n", "tool": "#!/usr/bin/python3\nprint(1)\n"}

def make_tree(root:Path) -> Path:
    "A repository with good files of several languages and every kind of bad file."
    for rel, text in GOOD.items():
        (root/rel).parent.mkdir(parents=True, exist_ok=True); (root/rel).write_text(text)
    (root/"LICENSE").write_text(MIT)
    (root/"src/blob.c").write_bytes(b"\x7fELF\x02\x01\x00\x00\x00")
    (root/"src/latin.py").write_bytes("name = 'Müller'\n".encode("latin-1"))
    (root/"src/empty.py").write_text("")
    (root/"src/huge.py").write_text("x = 1\n" * 50_000)
    (root/"secret.py").write_text("TOKEN = 1\n"); os.chmod(root/"secret.py", 0)
    (root/"notes.md").write_text("# notes\n"); (root/"perl_tool").write_text("#!/usr/bin/perl\nprint 1;\n")
    os.symlink("loop.py", root/"loop.py")                        # a link to itself
    os.symlink("..", root/"src/up")                              # a directory link back up the tree
    outside = root.parent/"outside.py"; outside.write_text("stolen = 1\n")
    os.symlink(outside, root/"escape.py")                        # a file outside the tree
    os.symlink("nowhere.py", root/"dangling.py")
    os.mkfifo(root/"pipe.py")
    return root

@pytest.fixture
def tree(tmp_path): return make_tree(tmp_path/"repo")

def test_tree_keeps_good_files_and_counts_bad(tree):
    stats = Counter()
    items = list_items(f"dir:{tree}", stats)
    docs = load_documents(items, stats, max_bytes=100_000)
    got = {d["path"].removeprefix("repo/") for d in docs}
    expected = set(GOOD) | ({"secret.py"} if IS_ROOT else set())  # root reads a file whatever its mode
    assert got == expected
    assert all(d["license"] == "MIT" and d["source"] == "dir/repo" for d in docs)
    langs = {d["path"].removeprefix("repo/"): d["lang"] for d in docs}
    assert langs["src/Main.java"] == "java" and langs["web/app.ts"] == "typescript" and langs["scripts/deploy"] == "shell"
    assert langs["tool"] == "python" and langs["src/lib.cpp"] == "cpp"
    for reason, n in {"binary": 1, "not_utf8": 1, "empty": 1, "too_big": 1, "symlink_loop": 2, "symlink_escape": 1,
                      "broken_symlink": 1, "not_regular": 1, "not_code": 3}.items():
        assert stats[f"skip/{reason}"] == n, (reason, stats)
    assert stats["skip/unreadable"] == (0 if IS_ROOT else 1)
    assert stats["kept"] == len(docs) and stats["loaded"] == len(items)

def _unprivileged(fn):
    "Run `fn()` in a forked child as an unprivileged user when this is root (root reads any file whatever its mode)."
    if not IS_ROOT: return fn()
    importlib.import_module("encodings.utf_8_sig")  # the child may not be able to import from a root-only interpreter folder
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try: os.setgroups([]); os.setgid(65534); os.setuid(65534)
        except OSError as e: out = {"no_switch": repr(e)}
        else:
            try: out = {"result": fn()}
            except BaseException as e: out = {"error": repr(e)}
        os.write(w, json.dumps(out).encode()); os._exit(0)
    os.close(w); os.waitpid(pid, 0)
    with os.fdopen(r) as f: out = json.loads(f.read())
    if "no_switch" in out: pytest.skip(f"cannot switch to an unprivileged user here: {out['no_switch']}")
    assert "error" not in out, out["error"]
    return out["result"]

def test_unreadable_file_and_dir():
    d = Path(tempfile.mkdtemp(dir="/tmp")); os.chmod(d, 0o755)  # a folder another user can enter
    try:
        (d/"ok.py").write_text("x = 1\n"); (d/"LICENSE").write_text(MIT)
        (d/"a.py").write_text("x = 1\n"); os.chmod(d/"a.py", 0)
        (d/"sub").mkdir(); (d/"sub/b.py").write_text("y = 2\n"); os.chmod(d/"sub", 0)
        def run():
            stats = Counter()
            docs = load_documents(list_items(f"dir:{d}", stats), stats)
            return [x["path"] for x in docs], stats["skip/unreadable"], stats["skip/unreadable_dir"]
        paths, unreadable, unreadable_dir = _unprivileged(run)
        assert paths == [f"{d.name}/ok.py"] and unreadable == 1 and unreadable_dir == 1
    finally:
        os.chmod(d/"sub", 0o755); shutil.rmtree(d)

def test_file_gone_between_listing_and_loading(tmp_path):
    (tmp_path/"a.py").write_text("x = 1\n")
    items = list_items(f"dir:{tmp_path}")
    (tmp_path/"a.py").unlink()
    assert load_item(items[0])["skip"] == "unreadable"
    assert read_code(tmp_path) == (None, "not_regular")

def test_max_bytes_is_configurable(tmp_path):
    (tmp_path/"LICENSE").write_text(MIT); (tmp_path/"a.py").write_text("x = 1\n" * 100)  # 600 bytes
    items = list_items(f"dir:{tmp_path}")
    assert load_item(items[0], max_bytes=599)["skip"] == "too_big"
    assert load_item(items[0], max_bytes=600)["skip"] is None

def test_link_inside_tree_is_listed_once_under_its_own_name(tmp_path):
    (tmp_path/"real.py").write_text("x = 1\n"); os.symlink("real.py", tmp_path/"a_link.py")
    stats = Counter()
    items = list_items([f"dir:{tmp_path}", f"dir:{tmp_path}"], stats)
    assert [it["path"].split("/", 1)[1] for it in items] == ["real.py"]
    assert stats["skip/listed_twice"] == 3

ROWS = [dict(text="def f():\n    return 1\n", path="pkg/f.py", license="MIT"),
        dict(content="fn main() {}\n", lang="Rust", license="MIT OR Apache-2.0"),
        dict(text="# Title\n", path="README.md", license="MIT"),
        dict(text="print 1\n", lang="perl", license="MIT"),
        dict(text="a\0b", path="bin.py", license="MIT"),
        dict(text="x = 1\n" * 1000, path="big.py", license="MIT"),
        dict(text="int x;\n", path="gpl.c", license="GPL-3.0-only"),
        dict(text="y = 2\n", path="nolicense.py"),
        dict(path="notext.py", license="MIT")]

def _check_rows(items, stats, kind):
    assert [it["path"] for it in items][:2] == ["pkg/f.py", f"{items[1]['path'].split('#')[0]}#2"]
    assert stats[f"listed/{kind}"] == 6 and stats["skip/not_code"] == 2 and stats["skip/no_text"] == 1
    docs = load_documents(items, stats, max_bytes=2000)
    assert [d["path"] for d in docs] == ["pkg/f.py", items[1]["path"]]
    assert docs[1]["lang"] == "rust" and docs[1]["license"] == "MIT OR Apache-2.0"
    assert stats["skip/binary"] == 1 and stats["skip/too_big"] == 1 and stats["skip/license"] == 2
    assert stats["license/dropped/GPL-3.0-only"] == 1 and stats["license/dropped/unknown"] == 1

def test_jsonl_with_broken_lines(tmp_path):
    with open(tmp_path/"rows.jsonl", "w") as f:
        for i, r in enumerate(ROWS):
            f.write(json.dumps(r) + "\n")
            if i == 1: f.write('{"text": "unterminated\n[1, 2]\n\n')
    (tmp_path/"bad.jsonl").write_bytes(b'{"text": "\xff\xfe"}\n{"text": "z = 1\\n"}\n')
    stats = Counter()
    items = list_items(f"jsonl:{tmp_path}/rows.jsonl", stats)
    assert stats["skip/bad_json"] == 1 and stats["skip/bad_row"] == 1  # a broken line; a line that is not an object
    _check_rows(items, stats, "jsonl")
    stats = Counter()
    assert [it["text"] for it in list_items(f"jsonl:{tmp_path}/bad.jsonl", stats)] == ["z = 1\n"]
    assert stats["skip/bad_json"] == 1  # bytes that are not UTF-8 count as a broken line

def test_jsonl_gz_and_truncated_gz(tmp_path):
    data = gzip.compress("".join(json.dumps(dict(text=f"x = {i}\n", license="MIT")) + "\n" for i in range(2000)).encode())
    (tmp_path/"a.jsonl.gz").write_bytes(data)
    assert len(list_items(f"jsonl:{tmp_path}/a.jsonl.gz")) == 2000
    (tmp_path/"a.jsonl.gz").write_bytes(data[:len(data) // 2])
    stats = Counter()
    items = list_items(f"jsonl:{tmp_path}", stats)  # a folder of JSONL files
    assert 0 < len(items) < 2000 and stats["skip/unreadable"] == 1

def _table():
    return [{k: r.get(k) for k in ("text", "content", "path", "lang", "license")} for r in ROWS]

def test_parquet(tmp_path):
    import pyarrow as pa, pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(_table()), tmp_path/"rows.parquet")
    stats = Counter()
    _check_rows(list_items(f"parquet:{tmp_path}/rows.parquet", stats), stats, "parquet")

def test_hf_dataset_saved_to_disk(tmp_path):
    from datasets import Dataset, DatasetDict
    Dataset.from_list(_table()).save_to_disk(str(tmp_path/"ds"))
    stats = Counter()
    _check_rows(list_items(f"hf:{tmp_path}/ds", stats), stats, "hf")
    DatasetDict(train=Dataset.from_list(_table()), test=Dataset.from_list(_table()[:1])).save_to_disk(str(tmp_path/"dd"))
    items = list_items(f"hf:{tmp_path}/dd")
    assert [it["source"] for it in items] == ["hf/dd/test"] + ["hf/dd/train"] * 6

def test_missing_text_column_is_a_clear_error(tmp_path):
    import pyarrow as pa, pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist([dict(code="x = 1")]), tmp_path/"c.parquet")
    with pytest.raises(ValueError, match="no `text` or `content` column .*rename the column"): list_items(f"parquet:{tmp_path}/c.parquet")
    (tmp_path/"junk.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="junk.parquet is not a readable Parquet file"): list_items(f"parquet:{tmp_path}/junk.parquet")

def test_missing_paths_fail_before_any_work(tmp_path):
    stats = Counter()
    with pytest.raises(FileNotFoundError, match=r"Source 'dir:/no/such/repo': /no/such/repo does not exist; fix the path"):
        list_items(["stdlib", "packages", "dir:/no/such/repo"], stats)
    assert stats == Counter()  # nothing was listed before the error
    with pytest.raises(FileNotFoundError, match="jsonl:/nope.jsonl"): check_sources(["jsonl:/nope.jsonl"])
    with pytest.raises(ValueError, match="Unknown source 'git:x'"): check_sources("git:x")
    with pytest.raises(ValueError, match="takes no path"): check_sources("stdlib:/usr/lib")
    with pytest.raises(FileNotFoundError, match="no .jsonl files"): check_sources(f"jsonl:{tmp_path}")
    with pytest.raises(ValueError, match="not a dataset saved with"): check_sources(f"hf:{tmp_path}")

@pytest.mark.parametrize("expr,allowed", [
    ("MIT", True), ("MIT OR Apache-2.0", True), ("GPL-3.0-only OR MIT", True), ("MIT OR GPL-3.0-only", True),
    ("MIT AND Apache-2.0", True), ("MIT AND GPL-3.0-only", False), ("GPL-2.0-only AND MIT", False),
    ("(MIT OR GPL-2.0-only) AND BSD-3-Clause", True), ("(MIT AND GPL-2.0-only) OR BSD-3-Clause", True),
    ("MIT AND (GPL-2.0-only OR LGPL-2.1-only)", False), ("GPL-2.0-only OR MIT AND LGPL-2.1-only", False),
    ("Apache-2.0 WITH LLVM-exception", True), ("GPL-2.0-only WITH Classpath-exception-2.0", False),
    ("Apache-2.0 AND Apache-2.0 WITH LLVM-exception AND BSD-2-Clause AND BSD-3-Clause AND BSL-1.0 AND MIT", True),
    ("MPL-2.0 AND MIT", False), ("unknown", False), ("", False), ("MIT AND", False), ("(MIT", False), ("MIT)", False),
    ("LicenseRef-Proprietary", False), ("mit or apache-2.0", True), ("MIT OR OR", False)])
def test_spdx_expressions(expr, allowed):
    assert license_allowed(expr) is allowed

def test_allow_list_is_configurable():
    assert not license_allowed("MPL-2.0 AND MIT") and license_allowed("MPL-2.0 AND MIT", PERMISSIVE | {"MPL-2.0"})
    assert license_allowed("unknown", {"unknown"}) and not license_allowed("MIT", {"Apache-2.0"})

@pytest.mark.parametrize("raw,spdx", [  # strings as they appear in real package metadata
    ("Apache", "Apache-2.0"), ("Apache 2.0", "Apache-2.0"), ("Apache Software License", "Apache-2.0"),
    ("Apache Software License 2.0", "Apache-2.0"), ("Apache License, Version 2.0", "Apache-2.0"),
    ("Apache 2.0 License", "Apache-2.0"), ("BSD", "BSD-3-Clause"), ("BSD License", "BSD-3-Clause"),
    ("3-Clause BSD License", "BSD-3-Clause"), ("BSD-3-Clause", "BSD-3-Clause"), ("new BSD", "BSD-3-Clause"),
    ("Simplified BSD", "BSD-2-Clause"), ("MIT License", "MIT"), ("MIT", "MIT"), ("PSFL", "PSF-2.0"),
    ("ISC license", "ISC"), ("ISC License (ISCL)", "ISC"), ("MPL-2.0", "MPL-2.0"), ("MPL-2.0 AND MIT", "MPL-2.0 AND MIT"),
    ("MIT/Apache-2.0", "MIT OR Apache-2.0"), ("GPL-2.0", "GPL-2.0-only"), ("LGPL-2.1+", "LGPL-2.1-or-later"),
    ("GPLv3", "GPL-3.0-only"), ("LGPL", "LGPL-2.0-or-later"), ("UNKNOWN", "unknown"), ("", "unknown"), (None, "unknown"),
    ("Dual License", "unknown"),
    ("License :: OSI Approved :: Apache Software License", "Apache-2.0"),
    ("License :: OSI Approved :: BSD License", "BSD-3-Clause"),
    ("License :: OSI Approved :: Python Software Foundation License", "PSF-2.0"),
    ("License :: OSI Approved :: ISC License (ISCL)", "ISC"),
    ("License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)", "MPL-2.0"),
    ("License :: OSI Approved :: GNU General Public License v3 or later (GPLv3+)", "GPL-3.0-or-later"),
    ("License :: OSI Approved :: GNU Library or Lesser General Public License (LGPL)", "LGPL-2.0-or-later"),
    ("License :: OSI Approved :: GNU Affero General Public License v3", "AGPL-3.0-only"),
    ("License :: OSI Approved :: The Unlicense (Unlicense)", "Unlicense"),
    ("License :: OSI Approved :: zlib/libpng License", "Zlib"),
    ("License :: OSI Approved :: Boost Software License 1.0 (BSL-1.0)", "BSL-1.0"),
    ("License :: OSI Approved :: MIT No Attribution License (MIT-0)", "MIT-0"),
    ("License :: OSI Approved", "unknown"),
    ("BSD 3-Clause License\n\nCopyright (c) 2022, Jupyter\nAll rights reserved.\n\nRedistribution and use in source and "
     "binary forms, with or without\nmodification, are permitted provided that ...\n3. Neither the name of the copyright "
     "holder nor the names of its\n   contributors may be used to endorse", "BSD-3-Clause"),
    ("=========================\n The Kiwi licensing terms\n=========================\nKiwi is licensed under the terms "
     "of the Modified BSD License (also known as\nNew or Revised BSD), as follows:\n\nRedistribution and use in source "
     "and binary forms, with or without\nmodification...\nNeither the name of the Nucleic Development Team nor the names "
     "of its\ncontributors may be used to endorse", "BSD-3-Clause"),
    (MIT, "MIT")])
def test_normalize_real_metadata(raw, spdx):
    assert normalize_license(raw) == spdx

@pytest.mark.parametrize("name,spdx", [("scipy", "BSD-3-Clause"), ("matplotlib", "PSF-2.0"), ("tqdm", "MPL-2.0 AND MIT"),
                                       ("torchao", "BSD-3-Clause"), ("packaging", "Apache-2.0 OR BSD-2-Clause"),
                                       ("nbconvert", "BSD-3-Clause"), ("pexpect", "ISC"), ("defusedxml", "PSF-2.0")])
def test_installed_distribution_licences(name, spdx):
    try: dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError: pytest.skip(f"{name} is not installed")
    assert dist_license(dist) == spdx

def test_licence_texts_and_file_headers():
    gpl = "# This program is free software: you can redistribute it and/or modify\n# it under the terms of the GNU General " \
          "Public License as published by\n# the Free Software Foundation, either version 3 of the License, or\n# (at your " \
          "option) any later version.\nimport os\n"
    assert file_license(gpl) == "GPL-3.0-or-later"
    assert file_license("/*\n * SPDX-License-Identifier: BSD-3-Clause\n */\n") == "BSD-3-Clause"
    assert file_license("<!-- SPDX-License-Identifier: MIT -->\n") == "MIT"
    assert file_license("// Use of this source code is governed by a BSD-style\n// license that can be found in the LICENSE file.\n") == "BSD-3-Clause"
    assert file_license("# Copyright 2020 X\n# All rights reserved.\nimport os\n") is None
    isc = "Permission to use, copy, modify, and/or distribute this software for any purpose with or without fee is " \
          "hereby granted, provided that the above copyright notice and this permission notice appear in all copies."
    assert detect_license_text(isc) == "ISC"
    assert detect_license_text(isc.split(", provided")[0] + ".\n\nTHE SOFTWARE IS PROVIDED") == "0BSD"
    # the earliest notice wins: an MIT licence that quotes the GPL further down is MIT
    assert detect_license_text(MIT + "\nParts were once under the GNU General Public License version 2.\n") == "MIT"
    # the file's own licence wins over the inherited one, both ways
    assert load_item(dict(key="k", source="s", path="p.c", file=None, license="MIT", lang="c", text=gpl))["skip"] == "license"
    doc = load_item(dict(key="k", source="s", path="p.c", file=None, license="GPL-2.0-only", lang="c",
                         text="// SPDX-License-Identifier: MIT\nint x;\n"))
    assert doc["skip"] is None and doc["license"] == "MIT"

def test_root_licence_files_of_a_dual_licensed_repo(tmp_path):
    (tmp_path/"LICENSE-MIT").write_text(MIT)
    (tmp_path/"LICENSE-APACHE").write_text("                Apache License\n          Version 2.0, January 2004\n")
    (tmp_path/"lib.rs").write_text("fn f() {}\n")
    assert list_items(f"dir:{tmp_path}")[0]["license"] == "Apache-2.0 OR MIT"

def test_code_files():
    assert code_lang("a.cc") == (True, "cpp") and code_lang("a.mjs") == (True, "javascript") and code_lang("x.bash") == (True, "shell")
    assert code_lang("a.txt") == (False, None) and code_lang("Makefile", "all: x") == (False, None)
    assert code_lang("run", "#!/usr/bin/env node") == (True, "javascript")

def test_default_sources_parallel_sampling_and_pickling():
    assert default_sources() == ["stdlib", "packages"]
    stats = Counter()
    items = list_items(default_sources(), stats)
    assert stats["listed/stdlib"] > 300 and stats["listed/packages"] > 1000
    assert all(".." not in it["path"].split("/") for it in items)
    by_path = {it["path"]: it for it in items if it["source"] == "packages/packaging"}
    assert by_path["packaging/version.py"]["license"] == "Apache-2.0 OR BSD-2-Clause"
    s1, s2 = sample_items(items, 100), sample_items(items, 150)
    assert s2[:100] == s1 and len({it["key"] for it in s2}) == 150  # a bigger sample only adds items
    assert sample_items(list(reversed(items)), 100) == s1             # independent of listing order
    assert {it["source"].split("/")[0] for it in s2} == {"stdlib", "packages"}
    fn = pickle.loads(pickle.dumps(functools.partial(load_item, max_bytes=50_000)))
    serial, parallel = Counter(), Counter()
    docs = tally_documents(map(fn, s2), serial)
    assert load_documents(s2, parallel, max_bytes=50_000, num_proc=2) == docs and serial == parallel
    assert docs and all(license_allowed(d["license"]) for d in docs)
