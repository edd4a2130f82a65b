#!/usr/bin/env bash
# The project's test run: notebooks in sync, every notebook executed on the tiny preset, and pytest.
# The stage notebooks (01_data ... 06_eval) run once, as `make pipeline` runs them: `codellm pipeline` executes them
# with papermill into runs/nbtest, the run folder they default to, and tests/test_pipeline.py checks what it wrote
# (manifests, report, the tutorial reading the run). nbdev_test runs every other notebook.
# Two streams run side by side: the pipeline, then the notebooks that read its models; and pytest, then the notebooks
# that need no run or only its data stage (done minutes into the pipeline; the stream waits for it all the same).
# Each alone leaves a core idle much of the time (process start-up, servers, sandboxes, two ranks waiting on each
# other), so together they finish well before one after the other would, on any 2-core machine.
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
stages='^0[1-6]_[a-z]+\.ipynb$'       # run by the pipeline
no_run='^(00|01[a-f]|02a|06a)'         # the library's notebooks: they build what they show, or read the run's data
export OMP_NUM_THREADS=$threads
echo "== two streams side by side, $threads thread(s) each; logs in $logs/"
echo "   1: codellm pipeline (tiny) into runs/nbtest, its checks, then the notebooks reading its models"
echo "   2: pytest, then the notebooks that need no run or only its data"
( rc=0
  { codellm pipeline --preset tiny --run-dir runs/nbtest &&
    CODELLM_PIPELINE_RUN=runs/nbtest python -m pytest -q -p no:cacheprovider tests/test_pipeline.py::test_pipeline_end_to_end; } || rc=1
  (cd nbs && nbdev_test --n_workers 0 --timing --skip_file_re "^[_.]|$stages|$no_run") || rc=1
  exit $rc ) > "$logs/pipeline.log" 2>&1 & one=$!
( rc=0
  python -m pytest -q -p no:cacheprovider --durations=40 tests --deselect tests/test_pipeline.py::test_pipeline_end_to_end || rc=1
  until [ -f runs/nbtest/data/manifest.json ] || ! kill -0 $one 2>/dev/null; do sleep 5; done
  (cd nbs && nbdev_test --n_workers 0 --timing --file_re "$no_run") || rc=1
  exit $rc ) > "$logs/pytest.log" 2>&1 & two=$!
rc1=0; rc2=0
wait $two || rc2=$?; echo "   2 finished after $((SECONDS-start)) s (exit $rc2)"
wait $one || rc1=$?; echo "   1 finished after $((SECONDS-start)) s (exit $rc1)"

show() { if [ "$2" -eq 0 ]; then tail -n 40 "$1"; else cat "$1"; fi; }
echo "== 1: pipeline, its checks, notebooks"; show "$logs/pipeline.log" $rc1
echo "== 2: pytest, notebooks"; show "$logs/pytest.log" $rc2
echo "== whole test run: $((SECONDS-start)) s"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
