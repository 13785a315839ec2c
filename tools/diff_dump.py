#!/usr/bin/env python3
"""Compare two tensor dumps layer by layer.

    python3 tools/diff_dump.py DUMP_DIR REFERENCE_DIR [--tol 1e-3]

DUMP_DIR is what `infera run --dump-tensors NAME,... --dump-dir DUMP_DIR` wrote (index.tsv
plus one .npy per tensor, named <forward>-<name>[-<layer>].npy). REFERENCE_DIR holds .npy
files with the same names, written by the reference implementation under bring-up (for a
Hugging Face model: register forward hooks, save each layer's output with numpy.save under
the same name). Prints, per file in index order, the max absolute difference and the
relative error ||a - b|| / ||b||, and marks the first tensor whose relative error exceeds
--tol: the layer where the two implementations part. Exit status 1 when any does.
Requires only python3 and numpy.
"""

import argparse
import os
import sys

import numpy as np


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump_dir")
    p.add_argument("reference_dir")
    p.add_argument("--tol", type=float, default=1e-3, help="relative error that counts as a mismatch (default 1e-3)")
    a = p.parse_args(argv)
    index = os.path.join(a.dump_dir, "index.tsv")
    with open(index) as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    first_bad = None
    for file, name, layer, forward, nrows, ncols in rows:
        ref_path = os.path.join(a.reference_dir, file)
        if not os.path.exists(ref_path):
            print(f"{file:32s} (no reference)")
            continue
        x = np.load(os.path.join(a.dump_dir, file)).astype(np.float64)
        y = np.load(ref_path).astype(np.float64).reshape(x.shape)
        diff = np.abs(x - y)
        rel = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
        bad = rel > a.tol
        if bad and first_bad is None:
            first_bad = file
        print(f"{file:32s} max|d| {diff.max():.3e}  rel {rel:.3e}{'  <-- first mismatch' if file == first_bad else ''}")
    return 1 if first_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
