#!/usr/bin/env bash
# The registered learning experiment (docs/results.md, "Learning per generated token"), run with the code it was
# registered with, whatever this checkout holds now: a worktree of CODE installed as a package (not editable) in
# runs/learning-code/, the checkout's committed warm start (its hashes checked) and its run files. Arguments go
# to benchmarks/learning.py (--rows, --seeds, --workers, --report). Finished runs land in
# docs/data/learning_tokens/runs/; an interrupted one resumes from runs/bench/learning_tokens/.
set -euo pipefail
CODE=24a2ced999960f753d6e5d9c06782fc0fb974ba4
root=$(cd "$(dirname "$0")/.." && pwd)
frozen=$root/runs/learning-code
data=$root/docs/data/learning_tokens
(cd "$data/warm_start" && sha256sum --quiet -c SHA256SUMS) || {
  echo "error: docs/data/learning_tokens/warm_start differs from its SHA256SUMS; fix: git checkout it" >&2; exit 2; }
if [ ! -e "$frozen/site/.installed" ]; then
  rm -rf "$frozen" && git -C "$root" worktree prune
  git -C "$root" worktree add --detach "$frozen/src" "$CODE" >/dev/null
  "$root/.venv/bin/python" -m pip install --quiet --no-deps --target "$frozen/site" "$frozen/src"
  touch "$frozen/site/.installed"
fi
cd "$frozen/src"
# The text predictor visits a set of tokens, whose order follows Python's hash seed; fixed, a run is the same
# run whoever starts or resumes it.
export PYTHONHASHSEED=0
PYTHONPATH="$frozen/site" exec "$root/.venv/bin/python" benchmarks/learning.py --data "$data" \
  --work "$root/runs/bench/learning_tokens" "$@"
