#!/usr/bin/env bash
# Re-execute notebooks in place, so the outputs a reader sees come from the current code: the tiny preset, one shared
# run folder (runs/nbtest, rebuilt), then nbdev_clean. Progress bars are off: they are timings, different each run,
# and a stored notebook should change only when what it shows changes. Plots are stored (the inline backend, not Agg):
# the docs show them. Cells flagged `#| cuda` run only where a GPU is (elsewhere they keep no output).
# Usage: scripts/run_notebooks.sh [NOTEBOOK...]
set -euo pipefail
cd "$(dirname "$0")/../nbs"
export TQDM_DISABLE=1 HF_DATASETS_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONWARNINGS="ignore:IProgress not found"  # tqdm.auto, imported by libraries before ours can say so
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
notebooks=("$@"); [ ${#notebooks[@]} -gt 0 ] || { rm -rf ../runs/nbtest; notebooks=([0-9]*.ipynb index.ipynb tutorial_*.ipynb howto_*.ipynb); }
for nb in "${notebooks[@]}"; do
  start=$SECONDS
  python -c 'import sys; from codellm_nb.docs import execute_notebook; execute_notebook(sys.argv[1])' "$nb"
  echo "$nb: $((SECONDS-start)) s"
done
nbdev_clean
