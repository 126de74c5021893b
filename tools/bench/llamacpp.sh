# Sourced by duel.sh and stream_duel.sh: builds llama.cpp the way docs/BENCHMARKS.md describes
# ("How llama.cpp was obtained and built") — the PyPI sdist of llama-cpp-python 0.3.36, which
# bundles llama.cpp 0c1e57098 (its sha256 checked), a venv with cmake, ninja, numpy and gguf,
# and a -DGGML_NATIVE=ON Release build.
#
# LLAMA_NO_AMX=1 builds it without AMX (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 beside the
# native flags; read when build/ is configured, so remove DIR/build to rebuild). On a KVM guest
# that exposes AMX, the native build takes llama.cpp's AMX path, which dies with SIGILL at its
# first tileloadd in a prompt (BENCHMARKS, 2026-12-04, the Intel host with AMX).
#
# LLAMA_ISA=avx2 builds instead, into DIR/build-avx2, what an AVX2-only CPU gets: no native
# detection, AVX, AVX2, FMA, F16C and BMI2 on, every AVX-512 and AMX extension off — the peer
# of `waste --isa avx2` on an AVX-512 machine (duel.sh's ISA=avx2).

LLAMACPP_SDIST=llama_cpp_python-0.3.36.tar.gz
LLAMACPP_SDIST_SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# llamacpp_build DIR: the build tree build_llamacpp uses (DIR/build, or DIR/build-avx2).
llamacpp_build() {
    echo "$1/build${LLAMA_ISA:+-$LLAMA_ISA}"
}

# build_llamacpp DIR TOOL...: builds the named tools (llama-bench, llama-quantize, ...) into
# $(llamacpp_build DIR)/bin unless every one is there; the sdist, the venv and the build tree
# stay in DIR.
build_llamacpp() {
    local ll=$1 t missing=0 build
    build=$(llamacpp_build "$1")
    shift
    for t in "$@"; do [ -x "$build/bin/$t" ] || missing=1; done
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
    local isa=(-DGGML_NATIVE=ON)
    case ${LLAMA_ISA:-} in
        "") ;;
        avx2) isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                   -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
                   -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
        *) echo "LLAMA_ISA: '$LLAMA_ISA' is not avx2 (or empty, for a native build)" >&2; return 1 ;;
    esac
    [ -f "$build/build.ninja" ] || PATH=$ll/venv/bin:$PATH cmake -S "$ll/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_COMMIT=0c1e57098 "${no_amx[@]}" >&2
    PATH=$ll/venv/bin:$PATH ninja -C "$build" "$@" >&2
}
