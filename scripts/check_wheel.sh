#!/usr/bin/env bash
# The wheel as a user gets it (make wheel-check; CI runs it): a clean clone of the committed tree, `python -m
# build` with no warning and `twine check` clean, the bundled data inside the wheel, then a fresh venv that
# installs the wheel alone (no torch) and runs the README's first command.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# This machine sets PYTHONDONTWRITEBYTECODE, which makes setuptools warn that it skips byte-compiling.
unset PYTHONDONTWRITEBYTECODE

git clone --quiet "$ROOT" "$WORK/src"
"$PYTHON" -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/pip" install --quiet build twine
(cd "$WORK/src" && "$WORK/build-venv/bin/python" -m build --outdir "$WORK/dist" > "$WORK/build.log" 2>&1) \
    || { tail -40 "$WORK/build.log"; exit 1; }
if grep -inE "warning|deprecat|!!" "$WORK/build.log"; then
    echo "wheel-check: the build printed warnings (above)" >&2
    exit 1
fi
"$WORK/build-venv/bin/twine" check --strict "$WORK"/dist/*

WHEEL="$(ls "$WORK"/dist/*.whl)"
VERSION="$(grep -oE '__version__ = "[^"]+"' "$ROOT/trace_gym/__init__.py" | cut -d'"' -f2)"
case "$(basename "$WHEEL")" in
    trace_gym-"$VERSION"-py3-none-any.whl) ;;
    *) echo "wheel-check: expected trace_gym-$VERSION-py3-none-any.whl, got $(basename "$WHEEL")" >&2; exit 1 ;;
esac
"$WORK/build-venv/bin/python" - "$WHEEL" "$ROOT" <<'EOF'
import sys
import zipfile
from pathlib import Path

wheel, root = sys.argv[1], Path(sys.argv[2])
names = set(zipfile.ZipFile(wheel).namelist())
data = sorted(p.relative_to(root).as_posix() for p in (root / "environments" / "data").rglob("*") if p.is_file())
missing = [p for p in data if f"trace_gym/{p}" not in names]
if missing:
    sys.exit(f"wheel-check: bundled data missing from the wheel: {missing[:5]} ({len(missing)} files)")
for needed in ("trace_gym/training/viz/viewer_template.html", "trace_gym/integrations/env_server.py"):
    if needed not in names:
        sys.exit(f"wheel-check: {needed} missing from the wheel")
size = Path(wheel).stat().st_size
print(f"wheel-check: {Path(wheel).name}: {size / 1e6:.1f} MB, {len(names)} files, {len(data)} data files")
EOF

"$PYTHON" -m venv "$WORK/user-venv"
"$WORK/user-venv/bin/pip" install --quiet -c "$ROOT/constraints.txt" "$WHEEL"
if "$WORK/user-venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "wheel-check: the base install pulled torch" >&2
    exit 1
fi
cd "$WORK"  # not the checkout: the command must run from the installed wheel
"$WORK/user-venv/bin/trace-gym" eval --env trace/Arithmetic-v0 --policy expert --tasks 5 | tee "$WORK/eval.txt"
grep -q "1.000" "$WORK/eval.txt"
echo "wheel-check: ok"
