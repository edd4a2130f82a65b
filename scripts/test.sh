#!/usr/bin/env bash
# The project's test run: notebooks in sync, every notebook executed on the tiny preset, and pytest.
# The notebooks (one at a time: they share runs/nbtest, each building what it needs) and pytest run side by side:
# each alone leaves a core idle much of the time (process start-up, servers, sandboxes, two ranks waiting on
# each other), so together they finish well before one after the other would, on any 2-core machine.
# The fp32 path runs on every machine: tests that compare numbers force precision=fp32, while the notebooks use
# `auto` (bf16 where the CPU has it). CODELLM_CPU_BF16=0 makes a bf16 CPU behave as one without.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
start=$SECONDS
echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
     "bf16 for auto: $(python -c 'from codellm_nb.core import resolve_precision; print(resolve_precision() == "bf16")')"

# Both checks compare the files before and after, so they hold on a clean clone (as CI runs) and in a working tree
# with changes not yet committed alike.
snapshot() { find "$1" -type f \( -name '*.py' -o -name '*.ipynb' \) -not -path '*/.ipynb_checkpoints/*' | sort | xargs md5sum; }
echo "== nbdev_export leaves codellm_nb/ unchanged"
before=$(snapshot codellm_nb); nbdev_export
drift=$(diff <(echo "$before") <(snapshot codellm_nb) || true)
if [ -n "$drift" ]; then echo "codellm_nb/ differs from the notebooks' export (run nbdev_export and commit):"; echo "$drift"; exit 1; fi

echo "== nbdev_clean leaves nbs/ unchanged"
before=$(snapshot nbs); nbdev_clean
dirty=$(diff <(echo "$before") <(snapshot nbs) || true)
if [ -n "$dirty" ]; then echo "nbs/ is not clean (run nbdev_clean and commit):"; echo "$dirty"; exit 1; fi

# Each of the two streams gets half the cores for its threads. Two streams of 2 threads each on 2 cores spend the time
# their OpenMP threads wait at barriers spinning against each other: a training step measured here ran 2.2x slower in
# total than with one thread per stream.
threads=${OMP_NUM_THREADS:-$(( $(nproc) > 1 ? $(nproc) / 2 : 1 ))}
logs=runs/test-logs; rm -rf runs/nbtest "$logs"; mkdir -p "$logs"
echo "== notebooks (nbdev_test, tiny preset) and pytest, side by side, $threads thread(s) each; logs in $logs/"
(cd nbs && OMP_NUM_THREADS=$threads nbdev_test --n_workers 0 --timing) > "$logs/notebooks.log" 2>&1 & nbs_pid=$!
OMP_NUM_THREADS=$threads python -m pytest -q -p no:cacheprovider --durations=15 tests > "$logs/pytest.log" 2>&1 & py_pid=$!
nb_rc=0; py_rc=0
wait $py_pid || py_rc=$?; echo "   pytest finished after $((SECONDS-start)) s (exit $py_rc)"
wait $nbs_pid || nb_rc=$?; echo "   notebooks finished after $((SECONDS-start)) s (exit $nb_rc)"

show() { if [ "$2" -eq 0 ]; then tail -n 40 "$1"; else cat "$1"; fi; }
echo "== notebooks"; show "$logs/notebooks.log" $nb_rc
echo "== pytest"; show "$logs/pytest.log" $py_rc
echo "== whole test run: $((SECONDS-start)) s"
[ $nb_rc -eq 0 ] && [ $py_rc -eq 0 ]
