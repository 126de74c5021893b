# Sourced by duel.sh and stream_duel.sh: builds llama.cpp the way docs/BENCHMARKS.md describes
# ("How llama.cpp was obtained and built") — the PyPI sdist of llama-cpp-python 0.3.36, which
# bundles llama.cpp 0c1e57098 (its sha256 checked), a venv with cmake, ninja, numpy and gguf,
# and a -DGGML_NATIVE=ON Release build.

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
    [ -f "$ll/build/build.ninja" ] || PATH=$ll/venv/bin:$PATH cmake -S "$ll/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$ll/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_COMMIT=0c1e57098 >&2
    PATH=$ll/venv/bin:$PATH ninja -C "$ll/build" "$@" >&2
}
