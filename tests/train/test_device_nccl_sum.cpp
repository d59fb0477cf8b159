// The step's DP sum the way comm.backend: nccl runs it on a GPU, with the GPU and NCCL stood in
// for on the CPU: the trainer on a stand-in GPU (tests/nn/shifted_device.hpp: memory the host
// cannot touch) hands the bucket engine DEVICE memory (its gradients, or a device copy of the
// fixed-point sum), the communicator is device_staged_comm over the fake NCCL communicator
// (tests/comm/fake_device_comm.hpp) behind a wrapper that, like NCCL, reads device memory only
// and counts any host pointer that reaches it. The group must end on the bits of the CPU
// group, each range must be synchronised on the device before it is reported ready, and a
// joiner's state transfer (device buffers and host counters) must go through the same group.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/device_staged_comm.hpp"
#include "runtime/core/config.hpp"
#include "runtime/train/trainer.hpp"
#include "tests/comm/fake_device_comm.hpp"
#include "tests/nn/shifted_device.hpp"
#include "tests/train/stand_in_nccl.hpp"
#include "tests/train/dp_by_hand.hpp"

using namespace cohort;
using comm::communicator;

namespace {

using test::on_device;
using test::stand_in_memory;
using test::stand_in_nccl;

config job(const std::string& determinism, const std::string& backend) {
  // train.device: auto passes the config rules with nccl; the GPU trainers are handed their
  // (stand-in) device, the CPU ones resolve auto to the CPU here.
  return load_config_text(
      "model: {kind: gpt, n_layer: 2, n_head: 2, d_model: 16, context: 8}\ndata: {dataset: "
      "kjv}\ntrain: {steps: 6, global_batch: 16, micro_batch: 4, lr: 0.003, seed: 3, grad_clip: "
      "0.5, determinism: " +
          determinism + ", log_every: 1000, device: auto}\ncomm: {backend: " + backend + "}\n",
      "nccl.yaml");
}

struct rank_rig {
  std::unique_ptr<test::shifted_device> dev;
  std::unique_ptr<train::trainer> tr;
  stand_in_nccl* nccl = nullptr;
  std::unique_ptr<comm::device_staged_comm> comm;
  int unsynced_ready = 0;  ///< ranges reported ready with no device sync since the last report
};

// Steps [from, to) of a group of two, each rank on its thread, the sum through RIGS' comms.
void run_group(rank_rig (&rigs)[2], int64_t from, int64_t to) {
  auto rank_steps = [&](int r) {
    rank_rig& g = rigs[r];
    train::trainer& tr = *g.tr;
    comm::bucket_engine engine(*g.comm, static_cast<std::size_t>(tr.model().num_params()),
                               tr.reduction_type(), 0.001);
    for (int64_t s = from; s < to; ++s) {
      tr.begin_step();
      tr.wire(2, r);
      void* buf = tr.reduction_buffer();
      CHECK(on_device(buf));  // NCCL sums where the gradients are
      if (tr.reduction_type() == comm::grad_type::i64)
        engine.begin(static_cast<int64_t*>(buf));
      else
        engine.begin(static_cast<float*>(buf));
      std::size_t syncs = g.dev->syncs;
      tr.compute_gradients(s, train::replica_micro_batches(tr.micro_batches(), 2, r),
                           [&](std::size_t off, std::size_t n) {
                             // NCCL's stream is not the compute stream: the range must be
                             // final on the device before the engine may send it.
                             if (g.dev->syncs == syncs) ++g.unsynced_ready;
                             syncs = g.dev->syncs;
                             engine.mark_ready(off, n);
                           });
      engine.wait_all();
      tr.apply_step(s);
    }
  };
  std::thread t1(rank_steps, 1);
  rank_steps(0);
  t1.join();
}

std::string cpu_group(const std::string& det, int64_t steps) {
  // Two CPU replicas summed by hand: the bits every group of two must reach.
  train::trainer a(job(det, "auto")), b(job(det, "auto"));
  for (int64_t s = 0; s < steps; ++s) test::dp2_step_by_hand(a, b, s);
  return a.params_sha256();
}

void seat(rank_rig& g, const std::shared_ptr<comm::testing::fake_nccl_group>& group, int r,
          const std::string& det) {
  g.dev = std::make_unique<test::shifted_device>();
  g.tr = std::make_unique<train::trainer>(job(det, "nccl"), g.dev.get());
  auto inner = std::make_unique<stand_in_nccl>(std::make_shared<comm::testing::fake_device_comm>(
      group, r, std::chrono::milliseconds(60000)));
  g.nccl = inner.get();
  g.comm = std::make_unique<comm::device_staged_comm>(std::move(inner), stand_in_memory());
}

}  // namespace

TEST_CASE("nccl on a stand-in GPU: the device sum gives the CPU group's bits, host never read") {
  for (const char* det : {"fast", "bitwise"}) {
    CAPTURE(det);
    const std::string want = cpu_group(det, 4);
    auto group = std::make_shared<comm::testing::fake_nccl_group>(2);
    rank_rig rigs[2];
    for (int r = 0; r < 2; ++r) seat(rigs[r], group, r, det);
    run_group(rigs, 0, 4);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(rigs[r].tr->params_sha256() == want);
      CHECK(rigs[r].nccl->host_pointers == 0);
      CHECK(rigs[r].unsynced_ready == 0);
      CHECK(rigs[r].comm->staged_calls() == 0);  // the gradients pass straight through
    }
  }
}

TEST_CASE("nccl on a stand-in GPU: a joiner takes the donor's device state and host counters") {
  const std::string want = cpu_group("fast", 4);
  auto group = std::make_shared<comm::testing::fake_nccl_group>(2);
  rank_rig rigs[2];
  for (int r = 0; r < 2; ++r) seat(rigs[r], group, r, "fast");
  run_group(rigs, 0, 2);
  // Rank 1 comes back as a new process (a new trainer at step 0) and takes rank 0's state
  // the way replica_step::receive_state does: every state buffer, then the two counters.
  auto group2 = std::make_shared<comm::testing::fake_nccl_group>(2);
  rank_rig fresh[2];
  fresh[0].dev = std::move(rigs[0].dev);
  fresh[0].tr = std::move(rigs[0].tr);
  auto c0 = std::make_unique<stand_in_nccl>(std::make_shared<comm::testing::fake_device_comm>(
      group2, 0, std::chrono::milliseconds(60000)));
  fresh[0].nccl = c0.get();
  fresh[0].comm = std::make_unique<comm::device_staged_comm>(std::move(c0), stand_in_memory());
  seat(fresh[1], group2, 1, "fast");
  int64_t next[2] = {-1, -1};
  auto transfer = [&](int r) {
    train::trainer& tr = *fresh[r].tr;
    for (auto& [ptr, n] : tr.state_buffers()) fresh[r].comm->broadcast(ptr, n * sizeof(float), 0);
    tr.state_received();
    int64_t counters[2] = {tr.optimizer_steps(), r == 0 ? 2 : 0};
    fresh[r].comm->broadcast(counters, sizeof counters, 0);
    tr.set_optimizer_steps(counters[0]);
    next[r] = counters[1];
  };
  std::thread t1(transfer, 1);
  transfer(0);
  t1.join();
  CHECK(next[1] == 2);
  CHECK(fresh[1].tr->optimizer_steps() == 2);
  CHECK(fresh[1].tr->params_sha256() == fresh[0].tr->params_sha256());
  for (int r = 0; r < 2; ++r) {
    CHECK(fresh[r].nccl->host_pointers == 0);  // the counters were staged
    CHECK(fresh[r].comm->staged_calls() == 1);
  }
  run_group(fresh, 2, 4);
  CHECK(fresh[0].tr->params_sha256() == want);
  CHECK(fresh[1].tr->params_sha256() == want);
}
