// The King James Bible as a character-level language-modelling corpus, from the Debian
// package bible-kjv (its `bible` program), cached once under data.cache_dir.
// Owns the text, the 90/10 split, the byte vocabulary and window sampling; no tokenizer
// beyond single bytes.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/dataset.hpp"

namespace cohort {

/// Character corpus with a train / validation split.
///
/// Training: sequence j of micro-batch `micro` of step `step` is the window of context+1
/// characters of the training text at offset hash_coords(seed, step, micro*micro_batch+j)
/// mod (train_len - context - 1); ids = window[0, T), targets = window[1, T+1).
/// Evaluation: window k of the validation text starts at k*T (non-overlapping).
class kjv : public dataset {
 public:
  /// The range `bible` is asked for: the whole book.
  static constexpr const char* bible_range = "Gen1:1-Rev22:21";
  /// Name of the cache file under data.cache_dir.
  static constexpr const char* cache_name = "kjv.txt";

  /// A corpus over `text` with sequences of `context` characters. The first 90% of the
  /// characters train, the last 10% validate. Throws data_error when the text is too short
  /// for the context.
  kjv(std::string text, int context);

  /// The KJV text: cache_dir/kjv.txt when present and whole, otherwise the output of
  /// `bible -l0 Gen1:1-Rev22:21`, then written to the cache atomically (temp + rename).
  /// A leading "~" in cache_dir is $HOME. Throws data_error when `bible` is missing (naming
  /// the package bible-kjv) or fails.
  static std::string load_text(const std::string& cache_dir);
  /// Runs `program -l0 Gen1:1-Rev22:21` (found on PATH) and returns what it printed.
  static std::string run_bible(const std::string& program = "bible");
  /// True when `text` looks like the whole KJV as `bible -l0` prints it (used to reject a
  /// stale or cut-off cache).
  static bool looks_complete(std::string_view text);
  /// `path` with a leading "~" replaced by $HOME.
  static std::string expand_home(const std::string& path);

  std::string name() const override { return "kjv"; }
  bool is_language_model() const override { return true; }
  int num_classes() const override { return static_cast<int>(vocab_.size()); }
  int features() const override { return 0; }
  int context() const override { return context_; }
  int64_t train_size() const override { return split_; }
  void train_micro_batch(uint64_t seed, int64_t step, int micro, int micro_batch, int global_batch,
                         batch& out) const override;
  int64_t eval_size(int64_t max_tokens = 0) const override;
  void eval_batch(int64_t first, int n, batch& out) const override;
  std::map<std::string, std::string> preprocessing_metadata() const override;

  /// Sorted unique bytes of the whole text; id i is vocab()[i].
  const std::string& vocab() const { return vocab_; }
  /// Ids of `text`; throws data_error on a byte outside the vocabulary.
  std::vector<int32_t> encode(std::string_view text) const;
  /// Text of `ids`; throws data_error on an id outside [0, vocab size).
  std::string decode(const std::vector<int32_t>& ids) const;

  const std::string& text() const { return text_; }
  std::string_view train_text() const { return std::string_view(text_).substr(0, split_); }
  std::string_view validation_text() const { return std::string_view(text_).substr(split_); }
  /// Start offset in the training text of sequence `index` of step `step`.
  int64_t window_offset(uint64_t seed, int64_t step, int64_t index) const;

 private:
  /// Fills `out` with n rows of context_ ids and next-character targets; row j reads the
  /// window starting at start_of(j) (a pointer into ids_).
  template <class WindowStart>
  void fill_windows(int n, batch& out, WindowStart start_of) const;

  std::string text_;
  int context_;
  int64_t split_;  ///< characters in the training part
  std::string vocab_;
  std::array<int16_t, 256> id_;  ///< byte -> id, -1 when absent
  std::vector<uint8_t> ids_;     ///< text_ encoded
};

}  // namespace cohort
