# Sourced by duel.sh and stream_duel.sh: builds llama.cpp the way docs/BENCHMARKS.md describes
# ("How llama.cpp was obtained and built") — the PyPI sdist of llama-cpp-python 0.3.36, which
# bundles llama.cpp 0c1e57098 (its sha256 checked), a venv with cmake, ninja, numpy and gguf,
# and a -DGGML_NATIVE=ON Release build.
#
# LLAMA_NO_AMX=1 builds it without AMX (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 beside the
# native flags; read when build/ is configured, so remove DIR/build to rebuild). On a KVM guest
# that exposes AMX, the native build takes llama.cpp's AMX path, which dies with SIGILL at its
# first tileloadd in a prompt (BENCHMARKS, 2026-12-04, the Intel host with AMX).

LLAMACPP_SDIST=llama_cpp_python-0.3.36.tar.gz
LLAMACPP_SDIST_SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# build_llamacpp DIR TOOL...: builds the named tools (llama-bench, llama-quantize, ...) into
# DIR/build/bin unless every one is there; the sdist, the venv and the build tree stay in DIR.
build_llamacpp() {
    local ll=$1 t missing=0
    shift
    for t in "$@"; do [ -x "$ll/build/bin/$t" ] || missing=1; done
    [ "$missing" = 0 ] && return
    echo "building llama.cpp under $ll (a few minutes)" >&2
    mkdir -p "$ll"
    if [ ! -f "$ll/$LLAMACPP_SDIST" ]; then
        python3 -m pip download llama-cpp-python==0.3.36 --no-deps --no-binary llama-cpp-python -d "$ll" >&2
    fi
    echo "$LLAMACPP_SDIST_SHA  $ll/$LLAMACPP_SDIST" | sha256sum -c - >&2
    [ -d "$ll/llama_cpp_python-0.3.36" ] || tar xzf "$ll/$LLAMACPP_SDIST" -C "$ll"
    [ -x "$ll/venv/bin/python" ] || { python3 -m venv "$ll/venv" && "$ll/venv/bin/pip" install -q cmake ninja numpy gguf >&2; }
    local no_amx=()
    if [ "${LLAMA_NO_AMX:-0}" = 1 ]; then
        no_amx=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    fi
    [ -f "$ll/build/build.ninja" ] || PATH=$ll/venv/bin:$PATH cmake -S "$ll/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$ll/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_COMMIT=0c1e57098 "${no_amx[@]}" >&2
    PATH=$ll/venv/bin:$PATH ninja -C "$ll/build" "$@" >&2
}
