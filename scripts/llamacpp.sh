#!/usr/bin/env bash
# llama.cpp for the GGUF formats (q8_0, q4_0) of the quantization stage and the `llamacpp` serving engine:
# llama-cpp-python built from its source release into a wheel (its kernels compiled for this CPU) and installed into
# the project's environment, and the Hugging Face -> GGUF converter of the same llama.cpp release into .tools/llama.cpp.
# Idempotent: a matching install, and a wheel already built, are kept.
#   scripts/llamacpp.sh               build the wheel if needed, then install it into $PY (.venv/bin/python)
#   scripts/llamacpp.sh --wheel-only  build the wheel and the converter only, with $PYTHON (python3): it needs no .venv,
#                                     so it compiles while .venv installs (make setup)
set -euo pipefail
PY="${PY:-.venv/bin/python}"
PYTHON="${PYTHON:-python3}"
VER=0.3.36
RECIPE="$VER-noamx"  # the sources and flags below: a change to them gets a new name, so older builds are not reused
TOOLS="${TOOLS_DIR:-.tools}"
DEST="$TOOLS/llama.cpp"
WHEELS="$TOOLS/wheels/$RECIPE"
wheel_only=false; [ "${1:-}" = "--wheel-only" ] && wheel_only=true
if "$PY" -c "import llama_cpp, sentencepiece" 2>/dev/null && [ "$(cat "$DEST/RECIPE" 2>/dev/null)" = "$RECIPE" ]; then
  exit 0  # installed already (then no wheel is needed either)
fi
wheel() { ls "$WHEELS"/llama_cpp_python-"$VER"-*.whl 2>/dev/null | head -n 1; }
if [ -z "$(wheel)" ] || [ ! -f "$DEST/convert_hf_to_gguf.py" ]; then
  TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
  "$PYTHON" -m venv "$TMP/env"  # the build's own pip: the wheel is for this Python, whether or not .venv exists yet
  "$TMP/env/bin/python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$TMP"
  tar -xzf "$TMP/llama_cpp_python-$VER.tar.gz" -C "$TMP"
  SRC="$TMP/llama_cpp_python-$VER"
  if [ -z "$(wheel)" ]; then
    echo "building llama-cpp-python $VER for this CPU (about 2 minutes on 2 cores, once)"
    # Only the library: no multimodal (llava/mtmd) part, no tools, and not llama.cpp's `common` helpers, which the binding
    # forces on for the multimodal part and this project never loads (they were half the build); native: the SIMD this
    # CPU has (AVX2, AVX-512). The wheel is for this CPU only: it stays in .tools, never published.
    grep -q 'set(LLAMA_BUILD_COMMON ON CACHE' "$SRC/CMakeLists.txt" || { echo "llama-cpp-python $VER: its CMakeLists.txt changed; update scripts/llamacpp.sh"; exit 1; }
    sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE/set(LLAMA_BUILD_COMMON OFF CACHE/' "$SRC/CMakeLists.txt"
    # Native, but without ggml's AMX kernels: on CPUs with AMX (Sapphire Rapids and later) its AMX path for q8_0/q4_0
    # crashed (a segmentation fault in the first decode) on models as small as the tiny preset's; the AVX-512 kernels
    # that CPUs without AMX use, and that every test checks against transformers, are used instead.
    CPU_CMAKE="$SRC/vendor/llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt"
    [ "$(grep -c '^ *list(APPEND ARCH_FLAGS -march=native)$' "$CPU_CMAKE")" = 1 ] || { echo "llama-cpp-python $VER: ggml's CPU CMakeLists.txt changed; update scripts/llamacpp.sh"; exit 1; }
    sed -i 's/^\( *\)list(APPEND ARCH_FLAGS -march=native)$/\1list(APPEND ARCH_FLAGS -march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)/' "$CPU_CMAKE"
    mkdir -p "$WHEELS"
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" \
      "$TMP/env/bin/python" -m pip wheel -q --no-deps "$SRC" -w "$WHEELS"
  fi
  rm -rf "$DEST" && mkdir -p "$DEST"
  cp -r "$SRC/vendor/llama.cpp/"{convert_hf_to_gguf.py,gguf-py,conversion,LICENSE} "$DEST/"
fi
if $wheel_only; then echo "llama.cpp $VER built: $(wheel), converter in $DEST"; exit 0; fi
# sentencepiece: the converter imports it for every Llama, even one without a SentencePiece model
"$PY" -m pip install -q --force-reinstall --no-deps "$(wheel)" && "$PY" -m pip install -q "$(wheel)" sentencepiece
"$PY" -c "import llama_cpp; assert llama_cpp.__version__ == '$VER'"
echo "$RECIPE" > "$DEST/RECIPE"
echo "llama.cpp $VER ready: llama_cpp in $PY, converter in $DEST"
