// cuBLAS, loaded when the first matrix product needs it (dlopen of libcublas.so.13) instead of
// linked: linking it made every cohort process (ctl, a worker on the CPU, the coordinator) map
// and relocate cuBLAS and cuBLASLt at start, 0.5 s and 235 MB each (`cohort --version`: 0.04 s
// and 19 MB without), for a library only a GPU step calls. Owns the seven entry points gpu/
// uses; callers include cublas_v2.h for the types only.
#pragma once
#include <cublas_v2.h>

#include <string>

namespace cohort::gpu::blas {

/// The entry points, resolved once per process; every call returns what cuBLAS would, or
/// CUBLAS_STATUS_NOT_INITIALIZED when the library could not be loaded (load_error() says why).
struct api {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  const char* (*status_string)(cublasStatus_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long, const void*, cudaDataType, int,
                                            long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t,
                                            cublasGemmAlgo_t) = nullptr;
};

/// The loaded entry points, or null when libcublas.so.13 (or one of them) is missing.
const api* get();
/// Why get() returned null ("" when it did not).
const std::string& load_error();

}  // namespace cohort::gpu::blas
