// Re-quantizes an F16/F32 GGUF with llama.cpp's own llama_model_quantize (from the libllama
// that node-llama-cpp ships), so that the GGUF conformance test and benchmark run both
// engines on the files llama.cpp users actually have (Q4_K_M, Q6_K, ...). Loaded with
// dlopen: no llama.cpp headers needed; only the two leading fields of
// llama_model_quantize_params (nthread, ftype) are set, over the library's own defaults.
//
//   cc -O1 -o llama_quantize tests/conformance/llama_quantize.c -ldl
//   llama_quantize LIBLLAMA.so IN.gguf OUT.gguf FTYPE
// FTYPE: llama.cpp's llama_ftype number (Q8_0 7, Q4_K_M 15, Q5_K_M 17, Q6_K 18, IQ4_XS 30).
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  _Alignas(16) unsigned char bytes[512];  // larger than any version's llama_model_quantize_params
} params_t;

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s LIBLLAMA.so IN.gguf OUT.gguf FTYPE\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  void (*backend_init)(void) = (void (*)(void))dlsym(lib, "llama_backend_init");
  params_t (*defaults)(void) = (params_t(*)(void))dlsym(lib, "llama_model_quantize_default_params");
  uint32_t (*quantize)(const char*, const char*, const params_t*) =
      (uint32_t(*)(const char*, const char*, const params_t*))dlsym(lib, "llama_model_quantize");
  if (!backend_init || !defaults || !quantize) {
    fprintf(stderr, "libllama lacks llama_model_quantize\n");
    return 1;
  }
  backend_init();
  params_t p = defaults();
  const int32_t nthread = 2, ftype = atoi(argv[4]);
  memcpy(p.bytes, &nthread, 4);
  memcpy(p.bytes + 4, &ftype, 4);
  const uint32_t rc = quantize(argv[2], argv[3], &p);
  if (rc != 0) fprintf(stderr, "llama_model_quantize failed (%u)\n", rc);
  return rc == 0 ? 0 : 1;
}
