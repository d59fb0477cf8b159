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
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/device_staged_comm.hpp"
#include "runtime/comm/local_kv.hpp"
#include "runtime/comm/regroup.hpp"
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

// Steps [from, to) of the group RIGS, each rank on its thread: run_group for any size.
void run_ranks(const std::vector<rank_rig*>& rigs, int64_t from, int64_t to) {
  const int n = static_cast<int>(rigs.size());
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      train::trainer& tr = *rigs[r]->tr;
      comm::bucket_engine engine(*rigs[r]->comm, static_cast<std::size_t>(tr.model().num_params()),
                                 tr.reduction_type(), 0.001);
      for (int64_t s = from; s < to; ++s) {
        tr.begin_step();
        tr.wire(n, r);
        if (tr.reduction_type() == comm::grad_type::i64)
          engine.begin(static_cast<int64_t*>(tr.reduction_buffer()));
        else
          engine.begin(static_cast<float*>(tr.reduction_buffer()));
        tr.compute_gradients(s, train::replica_micro_batches(tr.micro_batches(), n, r),
                             [&](std::size_t off, std::size_t k) { engine.mark_ready(off, k); });
        engine.wait_all();
        tr.apply_step(s);
      }
    });
  for (auto& t : ts) t.join();
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

TEST_CASE("nccl on a stand-in GPU: after a death the survivors shrink their group and train on") {
  // Three replicas train two steps; the third dies between steps. The roster's news
  // interrupts the survivors' communicators (dp_group_shared::abort_below), the group
  // regroups (comm::regroup) through the staging wrapper, and the two train two more steps on
  // the shrunk communicators: the same bits as two replicas on a group built new, the
  // gradients still passing straight through (device memory, nothing staged).
  for (const char* det : {"fast", "bitwise"}) {
    CAPTURE(det);
    std::string bits[2];
    for (const bool shrink : {true, false}) {
      auto group = std::make_shared<comm::testing::fake_nccl_group>(3);
      rank_rig rigs[3];
      for (int r = 0; r < 3; ++r) seat(rigs[r], group, r, det);
      run_ranks({&rigs[0], &rigs[1], &rigs[2]}, 0, 2);
      rigs[2].comm->abort();  // its process is gone
      rank_rig next[2];
      if (shrink) {
        comm::memory_kv kv;
        comm::regroup_result got[2];
        std::string errors[2];
        std::vector<std::thread> ts;
        for (int r = 0; r < 2; ++r) {
          rigs[r].comm->interrupt();
          CHECK(rigs[r].comm->can_shrink());
        }
        for (int r = 0; r < 2; ++r)
          ts.emplace_back([&, r] {
            comm::prior_group p;
            p.generation = 1;
            p.rank = r;
            p.size = 3;
            p.comms.push_back(std::move(rigs[r].comm));
            try {
              got[r] = comm::regroup(kv, 2, "dp", r, 2, std::move(p), 1, 22809, 5000,
                                     std::chrono::milliseconds(20000),
                                     std::chrono::milliseconds(1800000),
                                     [](std::size_t, const std::string&)
                                         -> std::unique_ptr<communicator> {
                                       throw std::runtime_error(
                                           "a new init where the group can shrink");
                                     });
            } catch (const std::exception& e) {
              errors[r] = e.what();
            }
          });
        for (auto& t : ts) t.join();
        for (int r = 0; r < 2; ++r) {
          CHECK(errors[r] == "");
          REQUIRE(got[r].path == comm::nccl_rebuild_path::shrink);
          CHECK(got[r].excluded == std::vector<int>{2});
          next[r].comm.reset(dynamic_cast<comm::device_staged_comm*>(got[r].comms[0].release()));
          REQUIRE(next[r].comm != nullptr);  // staged as before
        }
      } else {
        auto fresh = std::make_shared<comm::testing::fake_nccl_group>(2);
        for (int r = 0; r < 2; ++r) {
          auto c = std::make_unique<stand_in_nccl>(std::make_shared<comm::testing::fake_device_comm>(
              fresh, r, std::chrono::milliseconds(60000)));
          next[r].comm = std::make_unique<comm::device_staged_comm>(std::move(c), stand_in_memory());
        }
      }
      for (int r = 0; r < 2; ++r) {
        next[r].dev = std::move(rigs[r].dev);
        next[r].tr = std::move(rigs[r].tr);
      }
      run_ranks({&next[0], &next[1]}, 2, 4);
      CHECK(next[0].tr->params_sha256() == next[1].tr->params_sha256());
      for (int r = 0; r < 2; ++r) CHECK(next[r].comm->staged_calls() == 0);
      bits[shrink ? 0 : 1] = next[0].tr->params_sha256();
    }
    CHECK(bits[0] == bits[1]);
  }
}
