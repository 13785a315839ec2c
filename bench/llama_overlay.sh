# Sourced by the llama.cpp comparisons (gguf_bench.sh, quant_bench.sh), after they set $repo and
# $work: llama_overlay NAME VARIANT... makes llama.cpp load a CPU variant other than its best,
# and nlc_node is the node command line that runs its scripts (NLC_ROOT names the overlay).
# shellcheck shell=bash disable=SC2154,SC2034  # ($repo, $work: the caller's; nlc_node: used by it)
nlc_node=(node)
# An overlay of tests/conformance/node_modules in WORK_DIR/$1 whose linux-x64 package lacks the
# CPU variants named after it, so llama.cpp loads its best remaining one.
llama_overlay() {
  local name="$1"
  shift
  local nlc="$work/$name/node_modules" src="$repo/tests/conformance/node_modules"
  if [ ! -d "$nlc/@node-llama-cpp/linux-x64" ]; then
    mkdir -p "$nlc/@node-llama-cpp"
    for e in "$src"/* "$src"/.bin; do
      [ "$(basename "$e")" = @node-llama-cpp ] || ln -sfn "$e" "$nlc/$(basename "$e")"
    done
    for e in "$src"/@node-llama-cpp/*; do
      [ "$(basename "$e")" = linux-x64 ] || ln -sfn "$e" "$nlc/@node-llama-cpp/$(basename "$e")"
    done
    cp -r "$src/@node-llama-cpp/linux-x64" "$nlc/@node-llama-cpp/"
    for v in "$@"; do rm -f "$nlc/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-cpu-$v.so"; done
  fi
  export NLC_ROOT="$work/$name"
  nlc_node=(node --preserve-symlinks --preserve-symlinks-main)  # (the overlay's own linux-x64)
}
# "CPU variant: libggml-cpu-<variant>.so": the build llama.cpp loads here (from its debug log
# while it evaluates a few tokens of the GGUF file $1).
llama_variant() {
  NLC_LOG=1 "${nlc_node[@]}" "$repo/bench/llamacpp_speed.mjs" "$1" 1 8 1 2>&1 |
    grep -o -m1 'loaded CPU backend from .*' | sed 's|loaded CPU backend from .*/|CPU variant: |'
}
# The comparison without AVX-512 (AVX2=1 in the environment): Infera's avx2 path, llama.cpp's
# haswell variant (AVX2 / FMA / F16C: every variant with AVX-512 or AVX-VNNI removed).
# AVX2=vnni keeps llama.cpp's alderlake variant (AVX2 with the 256-bit AVX-VNNI dot products
# of Intel's client CPUs and E-core Xeons), for a CPU that has AVX-VNNI.
avx2_only() {
  export INFERA_ISA=avx2
  if [ "${AVX2:-0}" = vnni ]; then
    llama_overlay nlc_avxvnni sapphirerapids zen4 cooperlake cascadelake icelake cannonlake skylakex
  else
    llama_overlay nlc_avx2 sapphirerapids zen4 cooperlake cascadelake icelake cannonlake skylakex alderlake
  fi
}
