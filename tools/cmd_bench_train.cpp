// `cohort bench train`: training throughput of the step (full steps: forward, backward,
// AdamW) on the CPU or a GPU on synthetic data, printed as samples/s or tokens/s, ms/step and
// model FLOP utilisation. The
// work is runtime/nn/bench.cpp; this file only parses options and prints.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/bench.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

namespace {

void print_bench_train(const nn::bench_result& r, bool json) {
  if (json) {
    nlohmann::json j{{"impl", "cohort"},
                     {"model", r.model},
                     {"batch", r.batch},
                     {"tokens_per_step", r.tokens_per_step},
                     {"steps", r.steps},
                     {"threads", r.threads},
                     {"params", r.params},
                     {"seconds", r.seconds},
                     {"ms_per_step", r.ms_per_step},
                     {"best_ms", r.best_ms},
                     {"cpu_ms_per_step", r.cpu_ms_per_step},
                     {"samples_per_s", r.samples_per_s},
                     {"tokens_per_s", r.tokens_per_s},
                     {"first_loss", r.first_loss},
                     {"last_loss", r.last_loss},
                     {"pool_peak_bytes", r.pool_peak_bytes},
                     {"device", r.device},
                     {"precision", r.precision},
                     {"flops_per_step", r.flops_per_step},
                     {"achieved_tflops", r.achieved_tflops},
                     {"peak_tflops", r.peak_tflops},
                     {"mfu", r.mfu},
                     {"profile", r.profile}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    char unit[64];
    if (r.model == "gpt")
      std::snprintf(unit, sizeof unit, "%.0f tokens/s", r.tokens_per_s);
    else
      std::snprintf(unit, sizeof unit, "%.0f samples/s", r.samples_per_s);
    std::printf(
        "cohort %s batch %d on %s: %.3f ms/step (best %.3f, cpu %.3f), %s, params %lld, loss "
        "%.4f -> %.4f, %.1f GFLOP/s",
        r.model.c_str(), r.batch, r.device.c_str(), r.ms_per_step, r.best_ms, r.cpu_ms_per_step,
        unit, static_cast<long long>(r.params), r.first_loss, r.last_loss, 1e3 * r.achieved_tflops);
    if (r.peak_tflops > 0)
      std::printf(", MFU %.1f%% of %.0f TFLOP/s %s peak", 100 * r.mfu, r.peak_tflops,
                  r.precision.c_str());
    std::printf("\n");
    if (!r.profile.empty())
      std::printf(
          "per op (COHORT_DEVICE_PROFILE=1; warm-up and timed steps, each op between "
          "two waits):\n%s",
          r.profile.c_str());
  }
}

}  // namespace

void add_bench_train(CLI::App& bench, int* rc) {
  auto opts = std::make_shared<nn::bench_options>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "train",
      "Full training steps (forward, backward, AdamW) of the MLP or GPT on synthetic data from "
      "a fixed seed, after warm-up; compare with tools/bench_vs_torch.py");
  cmd->add_option("--model", opts->model, "mlp | gpt")
      ->check(CLI::IsMember({"mlp", "gpt"}))
      ->capture_default_str();
  cmd->add_option("--steps", opts->steps, "timed steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--batch", opts->batch, "samples (mlp) or sequences (gpt) per step; 0: 128 / 16")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads, "OpenBLAS threads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "seed of the model and the data")->capture_default_str();
  cmd->add_option("--vocab", opts->vocab, "gpt vocabulary")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--context", opts->context, "gpt context (tokens per sequence)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--n-layer", opts->n_layer, "gpt layers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--n-head", opts->n_head, "gpt heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--d-model", opts->d_model, "gpt width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--device", opts->device, "cpu | cuda | cuda:N | auto (as train.device)")
      ->capture_default_str();
  auto precisions = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"fp32"});
  cmd->add_option("--precision", *precisions,
                  "fp32 | bf16 (as train.precision), or a list (fp32,bf16): one run each, in the "
                  "same process, then their ratio and (on the CPU) the largest product alone")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--peak-tflops", opts->peak_tflops,
                  "the device's peak for the precision, for the utilisation; 0: the table's "
                  "figure for a known GPU (H100/H200, A100)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--json", *json, "print one JSON object instead of a line");
  cmd->callback([opts, json, rc, precisions] {
    std::vector<nn::bench_result> runs;
    for (const std::string& p : *precisions) {
      opts->precision = p;
      runs.push_back(nn::bench_train(*opts));
      print_bench_train(runs.back(), *json);
    }
    if (runs.size() > 1 && !*json) {
      for (std::size_t i = 1; i < runs.size(); ++i)
        std::printf("%s / %s: %.2fx the step's throughput\n", runs[i].precision.c_str(),
                    runs[0].precision.c_str(), runs[0].ms_per_step / runs[i].ms_per_step);
    }
    if (runs.size() > 1 && opts->device == "cpu") {
      // The model's largest product (the MLP's first layer, the GPT's c_fc), alone.
      const int rows = runs[0].tokens_per_step;
      const int n = opts->model == "gpt" ? 4 * opts->d_model : opts->hidden.front();
      const int k = opts->model == "gpt" ? opts->d_model : 784;
      nlohmann::json prod{{"m", rows}, {"n", n}, {"k", k}};
      for (const std::string& p : *precisions) {
        prod[p + "_gflops"] = nn::bench_cpu_product(rows, n, k, p);
        // One core's measured peak times the threads the product ran on.
        prod[p + "_peak_gflops"] = cpu::peak_gflops(p == "bf16") * opts->threads;
      }
      prod["bf16_isa"] = cpu::bf16_isa_name(cpu::cpu_bf16_isa());
      if (*json) {
        std::printf("%s\n", nlohmann::json{{"largest_product", prod}}.dump().c_str());
      } else {
        std::printf("largest product %dx%dx%d alone (bf16 ISA: %s):", rows, n, k,
                    cpu::bf16_isa_name(cpu::cpu_bf16_isa()));
        for (const std::string& p : *precisions) {
          const double g = prod[p + "_gflops"], peak = prod[p + "_peak_gflops"];
          std::printf(" %s %.1f GFLOP/s", p.c_str(), g);
          if (peak > 0)
            std::printf(" (%.0f%% of %d core(s)' %.0f, measured: a loop of independent %s)",
                        100 * g / peak, opts->threads, peak,
                        p == "bf16" ? "VDPBF16PS" : "512-bit FMAs");
          std::printf(";");
        }
        std::printf("\n");
      }
    }
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
