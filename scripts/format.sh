#!/usr/bin/env bash
# Formats the C++ sources of src/ and tests/ with clang-format and the repository's
# .clang-format (120 columns, Google-based).
# Usage: scripts/format.sh            rewrite the files in place
#        scripts/format.sh --check    change nothing; list what differs and fail if anything does
# CLANG_FORMAT names the binary (default: clang-format-14, else clang-format).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
clang_format=${CLANG_FORMAT:-}
if [ -z "$clang_format" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then clang_format=$c; break; fi
  done
fi
if [ -z "$clang_format" ]; then
  echo "format.sh: clang-format not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard -- 'src/*.cpp' 'src/*.h' 'tests/*.cpp' 'tests/*.h' |
                       grep -v '/node_modules/' || true)
else
  mapfile -t files < <(find src tests -path '*/node_modules' -prune -o \( -name '*.cpp' -o -name '*.h' \) -print | sort)
fi
if [ "${1:-}" = "--check" ]; then
  # --dry-run -Werror: one warning per place that would change, non-zero exit if any.
  if "$clang_format" --style=file --dry-run -Werror "${files[@]}"; then
    echo "format.sh: ${#files[@]} files formatted as .clang-format says"
  else
    echo "format.sh: files differ from .clang-format; run scripts/format.sh" >&2
    exit 1
  fi
else
  "$clang_format" --style=file -i "${files[@]}"
fi
