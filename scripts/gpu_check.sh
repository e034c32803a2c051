#!/usr/bin/env bash
# GPU path check: two TRACE steps of the tiny model with the vLLM backend, weight sync verified,
# prefix-cache hit rates and step time per stage reported. Exits non-zero on any failure; bounded to 8 minutes.
#
#   scripts/gpu_check.sh                      # vLLM on GPU 0 (needs: pip install -e '.[train,vllm]')
#   scripts/gpu_check.sh --backend hf --device cpu --roots 4 --sft-steps 0    # dry run without a GPU
#
# Extra arguments go to scripts/gpu_check.py (see --help). GPU_CHECK_TIMEOUT (seconds) changes the bound.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python="python3"; fi
fi
limit="${GPU_CHECK_TIMEOUT:-480}"

dry_run=0
for arg in "$@"; do
    [[ "$arg" == "hf" || "$arg" == "--backend=hf" ]] && dry_run=1
done

if [[ "$dry_run" == 0 ]]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu_check: nvidia-smi not found; this check needs an NVIDIA GPU (or pass --backend hf --device cpu)" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
    "$python" - <<'PY'
import sys
import torch
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, devices {torch.cuda.device_count()}")
sys.exit(0 if torch.cuda.is_available() else 3)
PY
fi

cd "$repo"
export RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
set +e
timeout --signal=TERM --kill-after=20 "$limit" "$python" "$here/gpu_check.py" "$@"
status=$?
set -e
if [[ "$status" == 124 ]]; then
    echo "gpu_check: FAILED, over the ${limit} s bound" >&2
elif [[ "$status" != 0 ]]; then
    echo "gpu_check: FAILED (exit $status)" >&2
else
    echo "gpu_check: all checks passed"
fi
exit "$status"
