// Text from a trained GPT (`cohort generate`; docs/serving.md): a checkpoint folder loaded
// into one process, its tokenizer read from the checkpoint (the training data's vocabulary,
// data.vocab), and tokens chosen one at a time by nn::sample_next. Owns the loading checks
// and the loop; the arithmetic is gpt::next_logits, the choice runtime/nn/sampling.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/gpt.hpp"
#include "runtime/nn/sampling.hpp"

namespace cohort::train {

/// A GPT as a checkpoint holds it, on the CPU, with the tokenizer it was trained with.
struct loaded_gpt {
  std::string path;  ///< the step folder read
  int64_t step = 0;  ///< the checkpoint's step (training had run this many)
  nn::gpt_shape shape;
  std::string vocab;  ///< token id -> its byte (a character-level vocabulary)
  std::unique_ptr<nn::gpt> model;
};

/// Loads PATH: a checkpoint folder (step_NNNNNNNN) or a run's checkpoint directory (its
/// newest complete checkpoint), checked as --resume checks it. Whole-model and pipeline
/// checkpoints (one shard per stage) are read; the model's sizes come from the tensors,
/// n_head from the metadata (model.n_head) or, for checkpoints written before it was
/// recorded, from N_HEAD (0: none given). Throws usage_error (exit 2) saying what is wrong
/// and what to do: not a GPT, tensor-parallel shards, no tokenizer, no n_head, a mismatch.
loaded_gpt load_gpt_checkpoint(const std::string& path, int n_head = 0);

/// TEXT as token ids of VOCAB; throws usage_error naming the first character it lacks.
std::vector<int32_t> encode_text(const std::string& vocab, const std::string& text);

/// What to generate.
struct generate_options {
  int max_tokens = 100;  ///< tokens to add after the prompt
  nn::sampling sample;
  uint64_t seed = 0;  ///< the generator's seed: the same seed, the same text
};

/// Adds up to opts.max_tokens tokens to PROMPT (non-empty ids of M's vocabulary), each from
/// the logits of the last context tokens (a longer text is cut from the left), calling
/// ON_TOKEN with each as it is chosen. Returns the new ids.
std::vector<int32_t> generate(nn::gpt& m, const std::vector<int32_t>& prompt,
                              const generate_options& opts,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace cohort::train
