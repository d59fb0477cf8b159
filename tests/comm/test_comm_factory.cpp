// Backend selection (comm.backend x device), and the NCCL backend's behaviour where no GPU
// exists: it compiles and links in every CUDA build, and says clearly that it cannot run.
#include <doctest/doctest.h>

#include "gpu/device.hpp"
#include "gpu/nccl_comm.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"
#include "runtime/comm/nccl_communicator.hpp"

using namespace cohort::comm;
using cohort::comm_backend;

TEST_CASE("parse_device and resolve_backend") {
  CHECK(parse_device("cpu") == -1);
  CHECK(parse_device("cuda") == 0);
  CHECK(parse_device("cuda:3") == 3);
  CHECK(parse_device("cuda:12") == 12);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "", "cuda:1:2"})
    CHECK_THROWS_AS(parse_device(bad), cohort::usage_error);

  CHECK(resolve_backend(comm_backend::automatic, "cpu") == comm_backend::gloo);
  CHECK(resolve_backend(comm_backend::automatic, "cuda:1") == comm_backend::nccl);
  // Gloo on host copies is allowed
  CHECK(resolve_backend(comm_backend::gloo, "cuda:0") == comm_backend::gloo);
  CHECK(resolve_backend(comm_backend::nccl, "cuda") == comm_backend::nccl);
  CHECK_THROWS_WITH_AS(resolve_backend(comm_backend::nccl, "cpu"),
                       doctest::Contains("nccl needs a CUDA device"), cohort::usage_error);
  CHECK_THROWS_AS(resolve_backend(comm_backend::gloo, "tpu"), cohort::usage_error);
}

TEST_CASE("make_communicator builds Gloo for auto on a CPU device") {
  memory_kv kv;
  auto c = make_communicator(comm_backend::automatic, "cpu", kv, 0, 1, 5, 1000);
  REQUIRE(c != nullptr);
  CHECK(std::string(c->backend()) == "gloo");
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  float x = 2.5f;
  c->allreduce_sum(&x, 1);
  CHECK(x == 2.5f);
  bool found = false;
  for (const auto& k : kv.keys()) found |= k.rfind("gen/5/dp/gloo/", 0) == 0;
  CHECK(found);
  CHECK_THROWS_AS(make_communicator(comm_backend::automatic, "cpu", kv, 0, 1, 5, 0),
                  cohort::usage_error);
}

TEST_CASE("the NCCL backend is compiled and without a GPU says it cannot run") {
  namespace gpu = cohort::gpu;
  if (gpu::cuda_compiled()) {
    CHECK(gpu::nccl_compiled());
    CHECK(gpu::nccl_version() >= 22800);  // ncclGetVersion needs no GPU
  }
  if (gpu::device_count() > 0) return;  // the GPU test binary covers a real device

  gpu::nccl_comm comm;
  std::vector<char> id(gpu::nccl_unique_id_bytes, 0);
  CHECK(comm.init(id, 0, 1, 0, 1000) == gpu::nccl_status::no_device);
  CHECK_FALSE(comm.last_error().empty());
  CHECK(comm.init(std::vector<char>(3), 0, 1, 0, 1000) == gpu::nccl_status::invalid_argument);
  float dummy = 0;
  CHECK(comm.allreduce_sum(&dummy, 1, gpu::nccl_dtype::f32) != gpu::nccl_status::ok);
  comm.abort();
  comm.abort();
  CHECK(comm.dead());

  memory_kv kv;
  try {
    make_communicator(comm_backend::automatic, "cuda:0", kv, 0, 1, 1, 1000);
    FAIL("an NCCL communicator was built without a GPU");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::unavailable);
    CHECK(std::string(e.what()).find("gloo") != std::string::npos);  // says what to do
  }
  CHECK(std::string(gpu::nccl_status_string(gpu::nccl_status::timeout)) == "timeout");
  CHECK(failure_of(gpu::nccl_status::timeout) == comm_failure::timeout);
  CHECK(failure_of(gpu::nccl_status::aborted) == comm_failure::aborted);
  CHECK(failure_of(gpu::nccl_status::nccl_error) == comm_failure::peer_lost);
}
