#!/usr/bin/env python3
"""Checks the module map: no module under src/infera/ includes a module the map puts above it.

Usage: scripts/check_layering.py [SRC_INFERA_DIR]   (default: src/infera beside this script)
       scripts/check_layering.py --self-test        (the check finds planted violations)

Exit status 0 when every #include "..." follows the rule below, 1 otherwise (each breach is
listed as file:line, the include, and the rule it breaks). docs/README.md states the same rule.
"""
import os
import re
import shutil
import sys
import tempfile

# Levels, lowest first. A module may include its own files and those of modules on lower
# levels. Modules that share a level (a band) do not include each other, except for the
# pairs listed in BAND_EDGES.
LEVELS = [
    ["base"],
    ["tensor"],
    ["kernels"],
    ["io", "tokenizer", "chat", "parallel"],
    ["constrain"],
    ["model"],
    ["runtime"],
    ["quant"],
    ["tools", "server"],
    ["cli"],
]
BAND_EDGES = {("chat", "tokenizer"), ("tokenizer", "io")}
# Lower modules that a module still must not include (the "knows nothing of" column of the
# design's module table).
NEVER = {
    ("io", "kernels"): "io reads and writes files, it knows nothing of kernels",
    ("model", "tokenizer"): "model/ holds inference only; text is the caller's business",
    ("model", "chat"): "model/ holds inference only; text is the caller's business",
    ("model", "constrain"): "model/ holds inference only; constrained decoding is the runtime's business",
    ("server", "kernels"): "the server reaches kernels only through the runtime and the model",
}

LEVEL_OF = {m: i for i, band in enumerate(LEVELS) for m in band}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".inc")


def why_not(src, dst):
    """None when module `src` may include module `dst`, else the reason."""
    if src == dst:
        return None
    if (src, dst) in NEVER:
        return NEVER[(src, dst)]
    ls, ld = LEVEL_OF[src], LEVEL_OF[dst]
    if ld < ls:
        return None
    if ld == ls:
        if (src, dst) in BAND_EDGES:
            return None
        return f"{src} and {dst} share a level and must not include each other"
    return f"{dst} is above {src} in the module map"


def module_of(path, root):
    """The module folder under `root` that holds `path`, or None."""
    rel = os.path.relpath(path, root)
    if rel.startswith(".."):
        return None
    return rel.split(os.sep)[0]


def check(root):
    """Returns (problems, files_checked, includes_checked)."""
    root = os.path.abspath(root)
    problems = []
    modules = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for m in modules:
        if m not in LEVEL_OF:
            problems.append(f"{m}/: module not in the map; add it to LEVELS in {os.path.basename(__file__)} "
                            "and to docs/README.md")
    src_root = os.path.dirname(root)  # the folder that holds infera/ (the include root)
    n_files = n_includes = 0
    for m in modules:
        if m not in LEVEL_OF:
            continue
        for dirpath, _, files in os.walk(os.path.join(root, m)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                n_files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        hit = INCLUDE.match(line)
                        if not hit:
                            continue
                        target = hit.group(1)
                        # "infera/<module>/..." from the include root, or relative to the file.
                        candidates = [os.path.join(src_root, target), os.path.join(dirpath, target)]
                        if target.startswith("infera/"):
                            candidates = candidates[:1]
                        dst = None
                        for c in candidates:
                            c = os.path.normpath(c)
                            if os.path.exists(c) or target.startswith("infera/"):
                                dst = module_of(c, root)
                                break
                        if dst is None or dst not in LEVEL_OF:
                            continue  # not a file of src/infera (or a module reported above)
                        n_includes += 1
                        reason = why_not(m, dst)
                        if reason:
                            rel = os.path.relpath(path, os.path.dirname(src_root))
                            problems.append(f"{rel}:{lineno}: includes \"{target}\": {reason}")
    return problems, n_files, n_includes


def self_test():
    """The check must catch each kind of breach, and pass a tree that keeps the rule."""
    made = []  # scratch trees, removed at the end

    def tree(files):
        top = tempfile.mkdtemp(prefix="infera_layering_")
        made.append(top)
        root = os.path.join(top, "infera")
        for rel, text in files.items():
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        return root

    good = {"base/a.h": "", "kernels/k.h": '#include "infera/base/a.h"\n',
            "chat/c.cpp": '#include "infera/tokenizer/t.h"\n#include "c.h"\n', "chat/c.h": "",
            "tokenizer/t.h": "", "cli/main.cpp": '#include "infera/server/s.h"\n#include "infera/tools/x.h"\n',
            "server/s.h": "", "tools/x.h": ""}
    cases = {
        "upward": {"base/a.h": '#include "infera/kernels/k.h"\n', "kernels/k.h": ""},
        "upward, relative path": {"base/a.h": '#include "../kernels/k.h"\n', "kernels/k.h": ""},
        "same band": {"tools/x.h": '#include "infera/server/s.h"\n', "server/s.h": ""},
        "band without an edge": {"tokenizer/t.h": '#include "infera/chat/c.h"\n', "chat/c.h": ""},
        "never pair": {"model/m.h": '#include "infera/tokenizer/t.h"\n', "tokenizer/t.h": ""},
        "unknown module": {"widgets/w.h": ""},
    }
    ok = True
    problems, _, n = check(tree(good))
    if problems or n == 0:
        print(f"self-test: a tree that keeps the rule was flagged: {problems}")
        ok = False
    for name, files in cases.items():
        problems, _, _ = check(tree(files))
        if len(problems) != 1:
            print(f"self-test: '{name}': expected one problem, got {problems}")
            ok = False
    for top in made:
        shutil.rmtree(top, ignore_errors=True)
    print("self-test: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "infera")
    problems, n_files, n_includes = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering problem(s); the rule is in docs/README.md (module map)")
        return 1
    print(f"module map kept: {n_includes} includes of src/infera headers in {n_files} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
