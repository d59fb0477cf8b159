// `cohort generate CKPT --prompt TEXT`: the continuation of TEXT by a GPT that cohort
// trained, in one process on the CPU (docs/serving.md). Owns the command line and the
// printing; loading and the loop are runtime/train/generate.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "runtime/train/generate.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

void add_generate(CLI::App& app, int* rc) {
  struct options {
    std::string checkpoint;
    std::string prompt;
    train::generate_options gen;
    int n_head = 0;
    bool quiet = false;
  };
  auto opt = std::make_shared<options>();
  opt->gen.max_tokens = 200;
  opt->gen.seed = 1;
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Continue a prompt with a GPT from a checkpoint: greedy (--temperature 0) or sampled. "
      "Prints the new text on stdout as it is made, and on stderr the model and the speed.");
  cmd->add_option("checkpoint", opt->checkpoint,
                  "A checkpoint folder (step_NNNNNNNN) or a run's checkpoint directory (its "
                  "newest complete checkpoint)")
      ->type_name("CKPT")
      ->required();
  cmd->add_option("--prompt", opt->prompt, "The text to continue (characters of the training text)")
      ->type_name("TEXT")
      ->required();
  cmd->add_option("--max-tokens", opt->gen.max_tokens, "Tokens (characters) to add")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", opt->gen.sample.temperature,
                  "Softmax temperature; 0 picks the most likely token every time")
      ->capture_default_str();
  cmd->add_option("--top-p", opt->gen.sample.top_p,
                  "Sample only from the most likely tokens that together hold this probability")
      ->capture_default_str();
  cmd->add_option("--seed", opt->gen.seed, "Seed of the sampler: the same seed, the same text")
      ->capture_default_str();
  cmd->add_option("--n-head", opt->n_head,
                  "model.n_head of the run, for checkpoints that do not record it")
      ->type_name("N");
  cmd->add_flag("-q,--quiet", opt->quiet, "Print only the new text");
  cmd->callback([opt, rc] {
    nn::check_sampling(opt->gen.sample);
    train::loaded_gpt g = train::load_gpt_checkpoint(opt->checkpoint, opt->n_head);
    const std::vector<int32_t> prompt = train::encode_text(g.vocab, opt->prompt);
    if (!opt->quiet)
      std::fprintf(stderr,
                   "generate: %s (step %lld): GPT of %d layers, d_model %d, %d heads, context %d, "
                   "%d tokens\n",
                   g.path.c_str(), static_cast<long long>(g.step), g.shape.n_layer, g.shape.d_model,
                   g.shape.n_head, g.shape.context, g.shape.vocab);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> added =
        train::generate(*g.model, prompt, opt->gen, [&g](int32_t id) {
          std::fputc(g.vocab[static_cast<std::size_t>(id)], stdout);
          std::fflush(stdout);
        });
    std::fputc('\n', stdout);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!opt->quiet)
      std::fprintf(stderr, "generate: %zu token(s) in %.2f s (%.0f tokens/s)\n", added.size(), s,
                   s > 0 ? static_cast<double>(added.size()) / s : 0.0);
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
