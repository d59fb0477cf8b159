#include "runtime/train/generate.hpp"

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/ckpt/safetensors.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {
namespace {

const std::vector<int64_t>& shape_of(
    const std::map<std::string, std::pair<tensor_info, std::size_t>>& all, const std::string& name,
    std::size_t rank, const std::string& where) {
  const auto it = all.find(name);
  if (it == all.end() || it->second.first.shape.size() != rank)
    throw usage_error(where + ": no " + std::to_string(rank) + "-d tensor '" + name +
                      "'; is this a checkpoint of a GPT that cohort trained?");
  return it->second.first.shape;
}

}  // namespace

loaded_gpt load_gpt_checkpoint(const std::string& path, int n_head) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec))
    throw usage_error("CKPT " + path +
                      ": no such folder; name a checkpoint folder (DIR/step_NNNNNNNN) or a "
                      "run's fault_tolerance.checkpoint_dir");
  const resume_point rp = checkpoint_from(path, "CKPT");  // trust, marker, every checksum
  const std::string& dir = rp.path;
  const training_metadata meta = read_checkpoint_metadata(dir);
  const auto kind = meta.extra.find("model.kind");
  if (kind != meta.extra.end() && kind->second != "gpt")
    throw usage_error(dir + " holds a model.kind '" + kind->second +
                      "' model; generate needs a GPT (model.kind: gpt)");
  if (metadata_number(meta, "parallel.tp", 1, 1, dir) != 1)
    throw usage_error(dir +
                      " was written by a tensor-parallel run (parallel.tp > 1): its shards hold "
                      "slices of each layer, which generate does not join yet; resume it with "
                      "parallel.tp: 1 for a checkpoint or two, then generate from that");
  const int64_t stages = metadata_number(meta, "parallel.pp", 1, 1, dir);
  const checkpoint_manifest manifest = read_checkpoint_manifest(dir);
  // Every stage's file, read whole with its checksum; tensors by name across them.
  std::vector<safetensors_file> files;
  std::map<std::string, std::pair<tensor_info, std::size_t>> all;  // name -> (tensor, file)
  for (int64_t p = 0; p < stages; ++p) {
    const std::string name = shard_file_name(static_cast<int>(p), 0);
    const shard_record* rec = manifest.find(name);
    if (rec == nullptr) throw usage_error(dir + ": its COMPLETE marker does not list " + name);
    read_options ro;
    ro.file_sha256 = rec->sha256;
    files.push_back(safetensors_file::read(dir + "/" + name, ro));
    for (const tensor_info& t : files.back().tensors()) {
      if (t.name.rfind("optim.", 0) == 0) continue;
      all[t.name] = {t, files.size() - 1};
    }
  }
  loaded_gpt g;
  g.path = dir;
  g.step = rp.step;
  const auto& wte = shape_of(all, "transformer.wte.weight", 2, dir);
  const auto& wpe = shape_of(all, "transformer.wpe.weight", 2, dir);
  g.shape.vocab = static_cast<int>(wte[0]);
  g.shape.d_model = static_cast<int>(wte[1]);
  g.shape.context = static_cast<int>(wpe[0]);
  while (all.count("transformer.h." + std::to_string(g.shape.n_layer) + ".ln_1.weight"))
    ++g.shape.n_layer;
  for (const auto& [name, t] : all)
    if (name.find(".mlp.router.weight") != std::string::npos)
      throw usage_error(dir + " holds a mixture-of-experts GPT (model.moe, " + name +
                        "): generate and serve do not run those yet (docs/moe.md)");
  const int64_t recorded = metadata_number(meta, "model.n_head", 0, 1, dir);
  if (recorded == 0 && n_head <= 0)
    throw usage_error(dir +
                      " does not record model.n_head (written before cohort recorded it); pass "
                      "--n-head N, the model.n_head of the config it was trained with");
  if (recorded != 0 && n_head > 0 && recorded != n_head)
    throw usage_error("--n-head " + std::to_string(n_head) + ": " + dir +
                      " was trained with model.n_head " + std::to_string(recorded) +
                      "; leave --n-head out");
  g.shape.n_head = static_cast<int>(recorded != 0 ? recorded : n_head);
  const auto vocab = meta.extra.find("data.vocab");
  if (vocab == meta.extra.end() || vocab->second.size() != static_cast<std::size_t>(g.shape.vocab))
    throw usage_error(dir + ": no tokenizer for its " + std::to_string(g.shape.vocab) +
                      " tokens (metadata data.vocab, written by the kjv data set)");
  g.vocab = vocab->second;
  g.model = std::make_unique<nn::gpt>(g.shape.vocab, g.shape.context, g.shape.n_layer,
                                      g.shape.n_head, g.shape.d_model, 1, 0);
  // Each parameter from the file that holds it; the shapes must be the model's.
  std::vector<std::vector<tensor_target>> targets(files.size());
  std::set<std::string> wanted;
  for (nn::parameter& p : g.model->parameters()) {
    const auto at = all.find(p.name);
    if (at == all.end())
      throw usage_error(dir + ": no tensor '" + p.name + "' for a GPT of " +
                        std::to_string(g.shape.n_layer) + " layers");
    targets[at->second.second].push_back({p.name, p.value.shape(), p.value.data(), dtype::f32});
    wanted.insert(p.name);
  }
  for (const auto& [name, info] : all)
    if (!wanted.count(name))
      throw usage_error(dir + ": tensor '" + name + "' is not part of a GPT of " +
                        std::to_string(g.shape.n_layer) + " layers and " +
                        std::to_string(g.shape.d_model) + " channels");
  try {
    for (std::size_t f = 0; f < files.size(); ++f) files[f].copy_into(targets[f]);
  } catch (const checkpoint_error& e) {
    throw usage_error(e.what());
  }
  return g;
}

std::vector<int32_t> encode_text(const std::string& vocab, const std::string& text) {
  std::vector<int32_t> id_of(256, -1);
  for (std::size_t i = 0; i < vocab.size(); ++i)
    id_of[static_cast<uint8_t>(vocab[i])] = static_cast<int32_t>(i);
  std::vector<int32_t> ids;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int32_t id = id_of[static_cast<uint8_t>(text[i])];
    if (id < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x",
                    static_cast<unsigned>(static_cast<uint8_t>(text[i])));
      throw usage_error("--prompt: byte " + std::string(hex) + " at offset " + std::to_string(i) +
                        " is not in the model's vocabulary of " + std::to_string(vocab.size()) +
                        " characters (the ones its training text holds)");
    }
    ids.push_back(id);
  }
  return ids;
}

std::vector<int32_t> generate(nn::gpt& m, const std::vector<int32_t>& prompt,
                              const generate_options& opts,
                              const std::function<void(int32_t)>& on_token) {
  nn::check_sampling(opts.sample);
  if (prompt.empty()) throw usage_error("--prompt: empty; give at least one character");
  if (opts.max_tokens < 0) throw usage_error("--max-tokens: must be 0 or more");
  const std::size_t context = static_cast<std::size_t>(m.shape().context);
  std::vector<int32_t> text = prompt, added;
  std::mt19937_64 rng(opts.seed);
  for (int k = 0; k < opts.max_tokens; ++k) {
    const std::size_t from = text.size() > context ? text.size() - context : 0;
    const std::vector<float> logits = m.next_logits(
        std::vector<int32_t>(text.begin() + static_cast<std::ptrdiff_t>(from), text.end()));
    const int32_t next = nn::sample_next(logits.data(), m.shape().vocab, opts.sample, rng);
    text.push_back(next);
    added.push_back(next);
    if (on_token) on_token(next);
  }
  return added;
}

}  // namespace cohort::train
