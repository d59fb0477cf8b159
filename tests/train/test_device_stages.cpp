// Pipeline and tensor-parallel stages on a stand-in GPU (tests/nn/shifted_device.hpp: the
// CPU's kernels over memory the host cannot touch) must end on the CPU stages' bits: the
// activations and their gradients cross the links through host copies, the TP sums too (or
// stay on the device where the TP group reads it), the DP sum reads host memory, the
// gradient norm goes stage to stage, and a checkpoint or a joiner's state moves between
// devices. The stages of every replica run on threads of this process, linked by in-memory
// mailboxes and TP groups; the DP sums are added by hand (what the transport does).
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/seat.hpp"
#include "tests/nn/shifted_device.hpp"
#include "tests/train/mailboxes.hpp"
#include "tests/train/stand_in_nccl.hpp"

using namespace cohort;

namespace {

config grid(int pp, int tp, int replicas, const std::string& determinism, int64_t steps,
            const std::string& schedule = "1f1b") {
  const std::string y =
      "model: {kind: gpt, n_layer: 2, n_head: 2, d_model: 16, context: 8}\n"
      "data: {dataset: kjv}\n"
      "parallel: {pp: " +
      std::to_string(pp) + ", tp: " + std::to_string(tp) + ", schedule: " + schedule +
      "}\n"
      "cluster: {workers: " +
      std::to_string(pp * tp * replicas) +
      "}\n"
      "train: {steps: " +
      std::to_string(steps) +
      ", global_batch: 16, micro_batch: 2, optimizer: adamw, lr: 0.003, seed: 3, "
      "grad_clip: 0.5, eval_every: 0, eval_tokens: 64, determinism: " +
      determinism + "}\n";
  return load_config_text(y, "stages.yaml");
}

using test::mailboxes;

/// One TP group in memory: round k of every rank is summed in rank order, so every rank
/// gets the same bits (what a real group promises).
template <class T>
class tp_sums {
 public:
  explicit tp_sums(int size) : size_(size) {}
  void allreduce(int rank, int64_t& round, T* data, int64_t n) {
    std::unique_lock<std::mutex> l(mu_);
    const int64_t k = round++;
    auto& parts = parts_[k];
    parts.resize(static_cast<std::size_t>(size_));
    parts[static_cast<std::size_t>(rank)].assign(data, data + n);
    if (++arrived_[k] == size_) {
      std::vector<T> sum(static_cast<std::size_t>(n), T{});
      for (const auto& p : parts)
        for (int64_t i = 0; i < n; ++i) sum[static_cast<std::size_t>(i)] += p[static_cast<std::size_t>(i)];
      sums_[k] = std::move(sum);
      cv_.notify_all();
    }
    cv_.wait(l, [&] { return sums_.count(k) != 0; });
    std::memcpy(data, sums_[k].data(), static_cast<std::size_t>(n) * sizeof(T));
    if (++taken_[k] == size_) {
      parts_.erase(k);
      arrived_.erase(k);
      sums_.erase(k);
      taken_.erase(k);
    }
  }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::vector<std::vector<T>>> parts_;
  std::map<int64_t, int> arrived_, taken_;
  std::map<int64_t, std::vector<T>> sums_;
};

/// Replicas x stages x TP ranks of seats, on the CPU or each on its own stand-in GPU.
struct job {
  config cfg;
  int R, P, T;
  std::vector<std::unique_ptr<test::shifted_device>> devices;
  std::vector<std::unique_ptr<train::seat>> seats;  // [(r * P + s) * T + t]
  std::vector<std::unique_ptr<mailboxes>> boxes;    // per (r, t)
  std::vector<std::unique_ptr<tp_sums<float>>> sums;
  std::vector<std::unique_ptr<tp_sums<double>>> sums64;  // per (r, s)
  std::vector<int64_t> rounds, rounds64;                 // per seat
  std::vector<std::size_t> syncs_seen;                   // per seat: its device's waits
  bool tp_reads_device = false;
  // With NCCL TP groups: one fake NCCL group per (r, s), each seat's rank of it behind the
  // staging wrapper, as make_communicator builds it for comm.backend: nccl.
  std::vector<std::shared_ptr<comm::testing::fake_nccl_group>> nccl_groups;  // per (r, s)
  std::vector<test::stand_in_nccl*> stand_ins;                               // per seat
  std::vector<std::unique_ptr<comm::device_staged_comm>> tp_comms;           // per seat

  job(const config& c, int replicas, bool gpu, bool reads_device = false, bool nccl = false)
      : cfg(c), R(replicas), P(c.parallel.pp), T(c.parallel.tp), tp_reads_device(reads_device) {
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < P; ++s)
        for (int t = 0; t < T; ++t) {
          nn::device* d = nullptr;
          if (gpu) {
            devices.push_back(std::make_unique<test::shifted_device>());
            d = devices.back().get();
          }
          seats.push_back(train::make_stage_seat(c, s, t, d));
        }
    for (int i = 0; i < R * T; ++i) boxes.push_back(std::make_unique<mailboxes>());
    for (int i = 0; i < R * P; ++i) {
      sums.push_back(std::make_unique<tp_sums<float>>(T));
      sums64.push_back(std::make_unique<tp_sums<double>>(T));
    }
    if (nccl) {
      for (int i = 0; i < R * P; ++i)
        nccl_groups.push_back(std::make_shared<comm::testing::fake_nccl_group>(T));
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < P; ++s)
          for (int t = 0; t < T; ++t) {
            auto inner = std::make_unique<test::stand_in_nccl>(
                std::make_shared<comm::testing::fake_device_comm>(
                    nccl_groups[static_cast<std::size_t>(r * P + s)], t, std::chrono::seconds(60)));
            stand_ins.push_back(inner.get());
            tp_comms.push_back(std::make_unique<comm::device_staged_comm>(std::move(inner),
                                                                          test::stand_in_memory()));
          }
    }
    rounds.assign(seats.size(), 0);
    rounds64.assign(seats.size(), 0);
    syncs_seen.assign(seats.size(), 0);
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < P; ++s)
        for (int t = 0; t < T; ++t) seat(r, s, t).set_links(links(r, s, t));
  }
  std::size_t index(int r, int s, int t) const { return static_cast<std::size_t>((r * P + s) * T + t); }
  train::seat& seat(int r, int s, int t) { return *seats[index(r, s, t)]; }

  train::stage_links links(int r, int s, int t) {
    train::stage_links l;
    mailboxes& m = *boxes[static_cast<std::size_t>(r * T + t)];
    l.send = [&m, s](int peer, uint64_t tag, const void* d, std::size_t n) { m.send(s, peer, tag, d, n); };
    l.recv = [&m, s](int peer, uint64_t tag, void* d, std::size_t n) { m.recv(peer, s, tag, d, n); };
    tp_sums<float>& f = *sums[static_cast<std::size_t>(r * P + s)];
    tp_sums<double>& g = *sums64[static_cast<std::size_t>(r * P + s)];
    int64_t& k = rounds[index(r, s, t)];
    int64_t& k64 = rounds64[index(r, s, t)];
    test::shifted_device* dev = devices.empty() ? nullptr : devices[index(r, s, t)].get();
    const bool on_device = tp_reads_device && dev != nullptr;
    std::size_t* synced = &syncs_seen[index(r, s, t)];
    l.tp_allreduce = [&f, &k, t, dev, on_device, synced](float* d, int64_t n) {
      // A TP group that reads the device (NCCL's) is handed device memory: here the shifted
      // address, which only the stand-in device can turn into a host one. NCCL reads it on a
      // stream of its own: the device was waited for since the last sum.
      if (on_device) {
        CHECK(dev->syncs > *synced);
        *synced = dev->syncs;
      }
      f.allreduce(t, k, on_device ? test::shifted_device::in(d) : d, n);
    };
    l.tp_reads_device = on_device;
    l.tp_allreduce_f64 = [&g, &k64, t](double* d, int64_t n) { g.allreduce(t, k64, d, n); };
    if (!tp_comms.empty()) {
      // NCCL's TP group: device memory straight to it, host doubles through its staging
      // (what dp_links hands a stage for comm.backend: nccl).
      comm::communicator* c = tp_comms[index(r, s, t)].get();
      l.tp_reads_device = true;
      l.tp_allreduce = [c](float* d, int64_t n) { c->allreduce_sum(d, static_cast<std::size_t>(n)); };
      l.tp_allreduce_f64 = [c](double* d, int64_t n) {
        comm::allreduce_sum_rank_order(*c, d, static_cast<std::size_t>(n));
      };
    }
    return l;
  }

  /// Runs F(r, s, t) for every seat of the job on its own thread.
  void every_seat(const std::function<void(int, int, int)>& f) {
    std::vector<std::thread> threads;
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < P; ++s)
        for (int t = 0; t < T; ++t) threads.emplace_back([&f, r, s, t] { f(r, s, t); });
    for (auto& th : threads) th.join();
  }

  /// Steps [from, to): each replica its contiguous share of the micro-batches, every range
  /// reported ready, the replicas' reduction buffers added (in replica order) per seat, the
  /// norm and the update. Returns the loss sums of the last stage's TP rank 0 per step.
  std::vector<double> run(int64_t from, int64_t to) {
    std::vector<double> losses;
    const int M = seat(0, 0, 0).micro_batches();
    for (int64_t step = from; step < to; ++step) {
      std::vector<double> loss(static_cast<std::size_t>(R), 0.0);
      every_seat([&](int r, int s, int t) {
        train::seat& st = seat(r, s, t);
        st.begin_step();
        std::vector<int> micro;
        for (int i = r * M / R; i < (r + 1) * M / R; ++i) micro.push_back(i);
        std::size_t reported = 0;
        const double l = st.compute_gradients(step, micro, [&](std::size_t, std::size_t n) { reported += n; });
        CHECK(reported == st.elements());
        if (st.speaks_for_loss()) loss[static_cast<std::size_t>(r)] = l;
      });
      for (int s = 0; s < P; ++s)
        for (int t = 0; t < T; ++t) {
          const bool i64 = seat(0, s, t).reduction_type() == comm::grad_type::i64;
          const std::size_t n = seat(0, s, t).elements();
          for (std::size_t i = 0; i < n; ++i) {
            if (i64) {
              int64_t sum = 0;
              for (int r = 0; r < R; ++r) sum += static_cast<int64_t*>(seat(r, s, t).reduction_buffer())[i];
              for (int r = 0; r < R; ++r) static_cast<int64_t*>(seat(r, s, t).reduction_buffer())[i] = sum;
            } else {
              float sum = 0;
              for (int r = 0; r < R; ++r) sum += static_cast<float*>(seat(r, s, t).reduction_buffer())[i];
              for (int r = 0; r < R; ++r) static_cast<float*>(seat(r, s, t).reduction_buffer())[i] = sum;
            }
          }
        }
      every_seat([&](int r, int s, int t) { seat(r, s, t).finish_gradients(step); });
      every_seat([&](int r, int s, int t) { seat(r, s, t).apply_step(step); });
      double total = 0;
      for (double l : loss) total += l;
      losses.push_back(total);
    }
    return losses;
  }

  /// Every seat's parameter digests, replica 0 keyed by (stage, name).
  std::map<std::string, std::string> digests() {
    std::map<std::string, std::string> out;
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < P; ++s)
        for (int t = 0; t < T; ++t)
          for (const auto& [name, d] : seat(r, s, t).report().param_digests) {
            const std::string key = std::to_string(s) + "/" + name;
            if (r == 0)
              out[key] = d;
            else
              CHECK(out[key] == d);  // the replicas agree
          }
    return out;
  }

  /// Held-out loss through replica 0's pipeline.
  double evaluate(int64_t tag) {
    double loss = -1;
    std::vector<std::thread> threads;
    for (int s = 0; s < P; ++s)
      for (int t = 0; t < T; ++t)
        threads.emplace_back([&, s, t] {
          const train::evaluation e = seat(0, s, t).evaluate(tag);
          if (e.count > 0) loss = e.loss;
        });
    for (auto& th : threads) th.join();
    return loss;
  }
};

}  // namespace

TEST_CASE("device stages: pipeline and tensor parallel stages on a stand-in GPU end on the CPU's bits") {
  struct shape {
    int pp, tp, replicas;
    const char* schedule;
  };
  for (const shape g : {shape{2, 1, 1, "1f1b"}, shape{1, 2, 1, "1f1b"}, shape{2, 2, 2, "1f1b"},
                        shape{2, 1, 2, "gpipe"}})
    for (const char* det : {"fast", "bitwise"}) {
      CAPTURE(g.pp);
      CAPTURE(g.tp);
      CAPTURE(g.replicas);
      CAPTURE(det);
      const config c = grid(g.pp, g.tp, g.replicas, det, 4, g.schedule);
      job cpu(c, g.replicas, false), gpu(c, g.replicas, true);
      CHECK(gpu.seat(0, 0, 0).device_name() == "shifted");
      CHECK(cpu.seat(0, 0, 0).device_name() == "cpu");
      const std::vector<double> want = cpu.run(0, 4);
      CHECK(gpu.run(0, 4) == want);
      CHECK(gpu.digests() == cpu.digests());
      CHECK(gpu.evaluate(4) == cpu.evaluate(4));
      // Every activation, gradient and host TP sum crossed the device boundary by copies.
      std::size_t to_host = 0;
      for (const auto& d : gpu.devices) to_host += d->to_host_bytes;
      CHECK(to_host > 0);
    }
}

TEST_CASE("device stages: a TP group that reads the device is handed device memory, same bits") {
  // NCCL's TP group sums the stage's device memory itself: no host copy on the way.
  const config c = grid(1, 2, 1, "fast", 3);
  job cpu(c, 1, false), gpu(c, 1, true, /*reads_device=*/true);
  CHECK(gpu.run(0, 3) == cpu.run(0, 3));
  CHECK(gpu.digests() == cpu.digests());
}

TEST_CASE("device stages: TP sums over NCCL on the stand-in read device memory only, same bits") {
  // comm.backend: nccl: the TP group is device_staged_comm over (fake) NCCL; the stage hands
  // it its device memory, and no host pointer may reach NCCL (the norm's host doubles go
  // through the staging scratch).
  for (const char* det : {"fast", "bitwise"}) {
    CAPTURE(det);
    const config c = grid(2, 2, 1, det, 3);
    job cpu(c, 1, false), gpu(c, 1, true, false, /*nccl=*/true);
    CHECK(gpu.run(0, 3) == cpu.run(0, 3));
    CHECK(gpu.digests() == cpu.digests());
    for (std::size_t i = 0; i < gpu.stand_ins.size(); ++i) {
      CHECK(gpu.stand_ins[i]->host_pointers == 0);
      CHECK(gpu.tp_comms[i]->staged_calls() > 0);  // the norm's sums of squares, staged
    }
  }
}

TEST_CASE("device stages: a stage's state moves between the CPU and a GPU, bit for bit") {
  // A joiner on one device takes a donor's state on the other (the transfer writes the
  // buffers state_buffers handed out; state_received puts a GPU's back), and both go on
  // to the same bits as a run that never moved.
  for (const bool donor_on_gpu : {false, true}) {
    CAPTURE(donor_on_gpu);
    const config c = grid(2, 1, 1, "bitwise", 6);
    job reference(c, 1, false), donor(c, 1, donor_on_gpu), joiner(c, 1, !donor_on_gpu);
    reference.run(0, 6);
    donor.run(0, 3);
    for (int s = 0; s < 2; ++s) {
      auto from = donor.seat(0, s, 0).state_buffers();
      auto into = joiner.seat(0, s, 0).state_buffers();
      REQUIRE(from.size() == into.size());
      for (std::size_t i = 0; i < from.size(); ++i) {
        REQUIRE(from[i].second == into[i].second);
        std::memcpy(into[i].first, from[i].first, from[i].second * sizeof(float));
      }
      donor.seat(0, s, 0).state_received();
      joiner.seat(0, s, 0).state_received();
      joiner.seat(0, s, 0).set_optimizer_steps(donor.seat(0, s, 0).optimizer_steps());
    }
    joiner.run(3, 6);
    donor.run(3, 6);
    CHECK(joiner.digests() == reference.digests());
    CHECK(donor.digests() == reference.digests());
  }
}

TEST_CASE("device stages: a checkpoint of GPU stages resumes on CPU stages, and the other way round") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("cohort_device_stages_" + std::to_string(::getpid()));
  const config c = grid(2, 2, 1, "fast", 6);
  job reference(c, 1, false);
  reference.run(0, 6);
  for (const bool gpu_first : {true, false}) {
    CAPTURE(gpu_first);
    const fs::path folder = dir / (gpu_first ? "gpu_first" : "cpu_first");
    job first(c, 1, gpu_first);
    first.run(0, 3);
    // Every seat writes its shard of the one checkpoint (what replica 0's members do, each
    // process with its writer; one at a time here, as the marker's temporary file is named
    // by the process).
    std::string step_dir;
    for (int s = 0; s < 2; ++s)
      for (int t = 0; t < 2; ++t) {
        train::checkpoint_writer w(folder.string(), 2);
        first.seat(0, s, t).save(w, 3, 7);
        const std::string d = w.wait();
        if (!d.empty()) step_dir = d;
      }
    REQUIRE(fs::exists(fs::path(step_dir)));
    job second(c, 1, !gpu_first);
    for (int s = 0; s < 2; ++s)
      for (int t = 0; t < 2; ++t) CHECK(second.seat(0, s, t).load_checkpoint(step_dir) == 3);
    second.run(3, 6);
    CHECK(second.digests() == reference.digests());
  }
  fs::remove_all(dir);
}

TEST_CASE("device stages: the config takes pipeline and tensor parallel stages on a GPU") {
  const config c = load_config_text(
      "model: {kind: gpt, n_layer: 2, n_head: 2, d_model: 16, context: 8}\n"
      "data: {dataset: kjv}\n"
      "parallel: {pp: 2, tp: 2}\n"
      "cluster: {workers: 4}\n"
      "comm: {backend: nccl}\n"
      "train: {device: cuda, precision: bf16}\n",
      "stages.yaml");
  CHECK(c.parallel.pp == 2);
  CHECK(c.train.device == "cuda");
}
