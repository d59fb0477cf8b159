// Backend selection (comm.backend x device), and the NCCL backend's behaviour where no GPU
// exists: it compiles and links in every CUDA build, and says clearly that it cannot run.
#include <doctest/doctest.h>

#include <thread>

#include "gpu/device.hpp"
#include "gpu/nccl_comm.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/group_devices.hpp"
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
  // auto is the host transports on a GPU too (the trainer stages for them): NCCL is opt-in.
  CHECK(resolve_backend(comm_backend::automatic, "cuda:1") == comm_backend::gloo);
  CHECK(resolve_backend(comm_backend::automatic, "cuda") == comm_backend::gloo);
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

TEST_CASE("make_communicator builds a host transport for auto on a GPU device") {
  memory_kv kv;
  auto c = make_communicator(comm_backend::automatic, "cuda:0", kv, 0, 1, 6, 1000);
  REQUIRE(c != nullptr);
  CHECK(std::string(c->backend()) == "gloo");
  bool nccl_key = false;
  for (const auto& k : kv.keys()) nccl_key |= k.find("/nccl/") != std::string::npos;
  CHECK_FALSE(nccl_key);
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
    make_communicator(comm_backend::nccl, "cuda:0", kv, 0, 1, 1, 1000);
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

TEST_CASE("mixed_devices_text: one kind passes, two kinds are named with their workers") {
  CHECK(mixed_devices_text("dp", {}) == "");
  CHECK(mixed_devices_text("dp", {{"a", "cpu"}, {"b", "cpu"}}) == "");
  // Two GPUs are one kind: each worker has its own.
  CHECK(mixed_devices_text("dp", {{"a", "cuda:0"}, {"b", "cuda:1"}}) == "");
  const std::string two = mixed_devices_text("dp", {{"a", "cuda:0"}, {"b", "cpu"}});
  CHECK(two.find("group 'dp' mixes devices: on cpu: b (rank 1, cpu); on cuda: a (rank 0, "
                 "cuda:0);") == 0);
  CHECK(two.find("train.device: cpu") != std::string::npos);  // says how to fix it
  std::vector<group_member> many;
  for (int i = 0; i < 11; ++i) many.push_back({"w" + std::to_string(i), "cpu"});
  many.push_back({"g", "cuda:0"});
  const std::string capped = mixed_devices_text("dp", many);
  CHECK(capped.find("w7 (rank 7, cpu) and 3 more;") != std::string::npos);
  CHECK(capped.find("w8 ") == std::string::npos);
  CHECK(capped.find("g (rank 11, cuda:0)") != std::string::npos);
}

namespace {

// Builds the group of two over 127.0.0.1 (Gloo), rank r claiming DEVICES[r]; what each rank
// threw ("" when it built), and the sum 1 + 2 when both built.
struct two_ranks {
  std::string error[2];
  float sum[2] = {0, 0};
};
two_ranks build_two(const std::string (&devices)[2]) {
  memory_kv kv;
  two_ranks out;
  auto run = [&](int r) {
    transport_options t;
    t.transport = cohort::comm_transport::gloo;
    t.hostname = "127.0.0.1";
    t.member = group_member{"worker-" + std::string(1, static_cast<char>('a' + r)), devices[r]};
    try {
      auto c = make_communicator(comm_backend::automatic, "cpu", kv, r, 2, 9, 5000, t);
      float x = static_cast<float>(r + 1);
      c->allreduce_sum(&x, 1);
      out.sum[r] = x;
    } catch (const cohort::usage_error& e) {
      out.error[r] = e.what();
    }
  };
  std::thread t1(run, 1);
  run(0);
  t1.join();
  return out;
}

}  // namespace

TEST_CASE("a group whose members compute on different kinds of device is refused on every rank") {
  // The same kind: the group forms and sums.
  const two_ranks same = build_two({"cpu", "cpu"});
  CHECK(same.error[0] == "");
  CHECK(same.error[1] == "");
  CHECK(same.sum[0] == 3.0f);
  CHECK(same.sum[1] == 3.0f);
  // Rank 1 says it resolved cuda (train.device: auto on a host with a GPU): both ranks end
  // with the same usage_error naming both workers and their devices, none hangs.
  const two_ranks mixed = build_two({"cpu", "cuda:0"});
  CAPTURE(mixed.error[0]);
  CHECK(mixed.error[0] == mixed.error[1]);
  CHECK(mixed.error[0].find("worker-a (rank 0, cpu)") != std::string::npos);
  CHECK(mixed.error[0].find("worker-b (rank 1, cuda:0)") != std::string::npos);
  CHECK(mixed.error[0].find("group 'dp' mixes devices") != std::string::npos);
}
