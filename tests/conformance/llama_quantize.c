// Re-quantizes an F16/F32 GGUF with llama.cpp's own llama_model_quantize (from the libllama
// that node-llama-cpp ships), so that the GGUF conformance tests and benchmark run both
// engines on the files llama.cpp users actually have (Q4_K_M, Q6_K, ...), and so that
// `infera convert --type q4_k_m` can be checked byte for byte against it. Loaded with
// dlopen: no llama.cpp headers needed; only the two leading fields of
// llama_model_quantize_params (nthread, ftype) are set over the library's own defaults,
// and with IMATRIX the imatrix pointer (offset 24 in this version's layout, checked below).
//
//   cc -O1 -o llama_quantize tests/conformance/llama_quantize.c -ldl
//   llama_quantize LIBLLAMA.so IN.gguf OUT.gguf FTYPE [IMATRIX]
// FTYPE: llama.cpp's llama_ftype number (Q8_0 7, Q4_K_M 15, Q5_K_M 17, Q6_K 18, IQ4_XS 30);
// a trailing 'p' ("2p") sets `pure` (llama-quantize --pure: no mix, every tensor that type).
// IMATRIX: importance weights per tensor, records of u32 name length, the name, u32 count,
// count f32 values (what llama-quantize hands over after reading an imatrix file).
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  _Alignas(16) unsigned char bytes[512];  // larger than any version's llama_model_quantize_params
} params_t;

typedef struct {  // llama_model_imatrix_data
  const char* name;
  const float* data;
  size_t size;
} imatrix_entry;

// Reads IMATRIX (format above) into a name == NULL terminated array; NULL on a bad file.
static imatrix_entry* read_imatrix(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t n = 0, cap = 16;
  imatrix_entry* e = calloc(cap + 1, sizeof *e);
  uint32_t len;
  while (fread(&len, 4, 1, f) == 1) {
    char* name = calloc(len + 1, 1);
    uint32_t count;
    if (fread(name, 1, len, f) != len || fread(&count, 4, 1, f) != 1) return NULL;
    float* data = malloc((size_t)count * 4 + 4);
    if (fread(data, 4, count, f) != count) return NULL;
    if (n == cap) {
      cap *= 2;
      e = realloc(e, (cap + 1) * sizeof *e);
    }
    e[n].name = name;
    e[n].data = data;
    e[n].size = count;
    ++n;
  }
  fclose(f);
  e[n].name = NULL;
  return e;
}

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s LIBLLAMA.so IN.gguf OUT.gguf FTYPE [IMATRIX]\n", argv[0]);
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
  const int pure = argv[4][strlen(argv[4]) - 1] == 'p';
  if (argc == 6 || pure) {
    // This version's layout: nthread, ftype, output_tensor_type, token_embedding_type (both
    // GGML_TYPE_COUNT by default), six bools (quantize_output_tensor = 1 at offset 17), then
    // the imatrix pointer at 24 (NULL by default); `pure` is the fourth bool, at 19.
    int32_t out_type, embd_type;
    void* ptr;
    memcpy(&out_type, p.bytes + 8, 4);
    memcpy(&embd_type, p.bytes + 12, 4);
    memcpy(&ptr, p.bytes + 24, sizeof ptr);
    if (out_type != embd_type || p.bytes[16] != 0 || p.bytes[17] != 1 || ptr != NULL) {
      fprintf(stderr, "llama_model_quantize_params has an unexpected layout\n");
      return 1;
    }
    p.bytes[19] = (unsigned char)pure;
  }
  if (argc == 6) {
    imatrix_entry* im = read_imatrix(argv[5]);
    if (!im) {
      fprintf(stderr, "cannot read %s\n", argv[5]);
      return 1;
    }
    memcpy(p.bytes + 24, &im, sizeof im);
  }
  const uint32_t rc = quantize(argv[2], argv[3], &p);
  if (rc != 0) fprintf(stderr, "llama_model_quantize failed (%u)\n", rc);
  return rc == 0 ? 0 : 1;
}
