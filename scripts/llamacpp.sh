#!/usr/bin/env bash
# llama.cpp for the GGUF formats (q8_0, q4_0) of the quantization stage and the `llamacpp` serving engine:
# llama-cpp-python built from its source release into the project's environment (its kernels compiled for this CPU),
# and Hugging Face -> GGUF converter of the same llama.cpp release into .tools/llama.cpp. Idempotent: a matching
# install is kept.
set -euo pipefail
PY="${PY:-.venv/bin/python}"
VER=0.3.36
DEST="${TOOLS_DIR:-.tools}/llama.cpp"
if "$PY" -c "import llama_cpp, sentencepiece; assert llama_cpp.__version__ == '$VER'" 2>/dev/null && [ -f "$DEST/convert_hf_to_gguf.py" ]; then
  exit 0
fi
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$TMP"
tar -xzf "$TMP/llama_cpp_python-$VER.tar.gz" -C "$TMP"
SRC="$TMP/llama_cpp_python-$VER"
if ! "$PY" -c "import llama_cpp; assert llama_cpp.__version__ == '$VER'" 2>/dev/null; then
  echo "building llama-cpp-python $VER for this CPU (about 2 minutes on 2 cores, once)"
  # Only the library: no multimodal (llava/mtmd) part, no tools, and not llama.cpp's `common` helpers, which the binding
  # forces on for the multimodal part and this project never loads (they were half the build); native: the SIMD this
  # CPU has (AVX2, AVX-512, AMX).
  grep -q 'set(LLAMA_BUILD_COMMON ON CACHE' "$SRC/CMakeLists.txt" || { echo "llama-cpp-python $VER: its CMakeLists.txt changed; update scripts/llamacpp.sh"; exit 1; }
  sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE/set(LLAMA_BUILD_COMMON OFF CACHE/' "$SRC/CMakeLists.txt"
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" \
    "$PY" -m pip install -q "$SRC"
fi
"$PY" -m pip install -q sentencepiece  # the converter imports it for every Llama, even one without a SentencePiece model
rm -rf "$DEST" && mkdir -p "$DEST"
cp -r "$SRC/vendor/llama.cpp/"{convert_hf_to_gguf.py,gguf-py,conversion,LICENSE} "$DEST/"
echo "llama.cpp $VER ready: llama_cpp in $PY, converter in $DEST"
