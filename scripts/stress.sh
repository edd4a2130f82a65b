#!/usr/bin/env bash
# The tests that depend on timing and concurrency (engines, gateway, replica pool, clients, sandbox and harness, resume),
# ROUNDS times (5) while other processes keep every core busy, then every test on generated inputs with ten times its
# examples and fresh ones (CODELLM_STRESS=1), still under load. Any failure in any round fails the run: a test that
# passes alone but can fail under load is a failing test. Logs in runs/stress-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROUNDS=${ROUNDS:-5}
CONCURRENT=(tests/test_engines.py tests/test_gateway.py tests/test_serve.py tests/test_clients.py tests/test_sandbox.py
            tests/test_harness.py tests/test_resume.py
            tests/test_quantize.py::test_llama_cpp_engine_batches_more_clients_than_slots
            tests/test_quantize.py::test_llama_cpp_engine_counts_add_up_whenever_read
            tests/test_quantize.py::test_llama_cpp_engine_fails_one_request_not_the_thread)
logs=runs/stress-logs; rm -rf "$logs"; mkdir -p "$logs"
hogs=()
cores=$(getconf _NPROCESSORS_ONLN)  # (nproc would answer OMP_NUM_THREADS)
for _ in $(seq "$cores"); do python3 -c 'while True: pass' & hogs+=($!); done  # as many busy processes as cores
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
echo "== $cores busy processes beside the tests; $ROUNDS rounds of the concurrency-sensitive tests; logs in $logs/"
failed=()
for r in $(seq "$ROUNDS"); do
  start=$SECONDS
  if python -m pytest -q -p no:cacheprovider -W ignore "${CONCURRENT[@]}" > "$logs/round$r.log" 2>&1; then status=passed
  else status=FAILED; failed+=("round $r"); grep -E "^(FAILED|ERROR)" "$logs/round$r.log" | sed 's/^/   /'; fi
  echo "   round $r: $status in $((SECONDS - start)) s ($(tail -n 1 "$logs/round$r.log"))"
done
start=$SECONDS
if CODELLM_STRESS=1 python -m pytest -q -p no:cacheprovider -W ignore -m generated tests > "$logs/generated.log" 2>&1; then status=passed
else status=FAILED; failed+=("generated inputs"); grep -E "^(FAILED|ERROR)" "$logs/generated.log" | sed 's/^/   /'; fi
echo "   generated inputs (10x examples): $status in $((SECONDS - start)) s ($(tail -n 1 "$logs/generated.log"))"
if [ ${#failed[@]} -gt 0 ]; then echo "== stress: failures in ${failed[*]}"; exit 1; fi
echo "== stress: every round passed"
