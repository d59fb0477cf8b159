// Built only with CUDA (cublas_v2.h is the toolkit's; the library itself is not linked).
#if COHORT_HAVE_CUDA
#include "gpu/cublas_loader.hpp"

#include <dlfcn.h>

#include <mutex>

namespace cohort::gpu::blas {

namespace {

std::string error_text;

template <class F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out != nullptr) return true;
  error_text = std::string("libcublas.so.13 has no ") + name;
  return false;
}

const api* load() {
  // The library stays loaded for the process's life (handles outlive any caller).
  void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    error_text = std::string("cannot load cuBLAS (libcublas.so.13): ") + (e ? e : "unknown") +
                 " (is the CUDA toolkit's lib64 folder on LD_LIBRARY_PATH?)";
    return nullptr;
  }
  static api a;
  // cublas_v2.h maps the v1 names onto these _v2 symbols.
  const bool ok = resolve(lib, "cublasCreate_v2", &a.create) &&
                  resolve(lib, "cublasDestroy_v2", &a.destroy) &&
                  resolve(lib, "cublasSetStream_v2", &a.set_stream) &&
                  resolve(lib, "cublasSetMathMode", &a.set_math_mode) &&
                  resolve(lib, "cublasGetStatusString", &a.status_string) &&
                  resolve(lib, "cublasGemmEx", &a.gemm_ex) &&
                  resolve(lib, "cublasGemmStridedBatchedEx", &a.gemm_strided_batched_ex);
  return ok ? &a : nullptr;
}

}  // namespace

const api* get() {
  static std::once_flag once;
  static const api* loaded = nullptr;
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

const std::string& load_error() { return error_text; }

}  // namespace cohort::gpu::blas
#endif
