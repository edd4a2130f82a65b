#!/usr/bin/env bash
# The project's test run: notebooks in sync, every notebook executed on the tiny preset, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
start=$SECONDS

echo "== nbdev_export leaves codellm_nb/ unchanged"
nbdev_export
if git rev-parse --git-dir >/dev/null 2>&1; then
  drift=$(git status --porcelain -- codellm_nb)
  if [ -n "$drift" ]; then echo "codellm_nb/ differs from the notebooks' export (run nbdev_export and commit):"; echo "$drift"; exit 1; fi
fi

echo "== nbdev_clean leaves nbs/ unchanged"
nbdev_clean
if git rev-parse --git-dir >/dev/null 2>&1; then
  dirty=$(git status --porcelain -- nbs)
  if [ -n "$dirty" ]; then echo "nbs/ is not clean (run nbdev_clean and commit):"; echo "$dirty"; exit 1; fi
fi

echo "== notebooks (nbdev_test, tiny preset)"
rm -rf runs/nbtest
# one notebook at a time: pretraining already uses both cores with two ranks
nbdev_test --n_workers 0 --timing

echo "== pytest"
python -m pytest -q tests
echo "== whole test run: $((SECONDS-start)) s"
