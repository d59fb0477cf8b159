#include "runtime/comm/kv_client.hpp"

namespace cohort::comm {

std::string generation_key(std::uint64_t generation, const std::string& key) {
  return "gen/" + std::to_string(generation) + "/" + key;
}

kv_gloo_store::kv_gloo_store(kv_client& kv, std::uint64_t generation,
                             std::chrono::milliseconds get_timeout)
    : kv_(kv), generation_(generation), get_timeout_(get_timeout) {}

void kv_gloo_store::set(const std::string& key, const std::vector<char>& data) {
  kv_.set(generation_key(generation_, key), data);
}

std::vector<char> kv_gloo_store::get(const std::string& key) {
  return kv_.get(generation_key(generation_, key), get_timeout_);
}

void kv_gloo_store::wait(const std::vector<std::string>& keys) { wait(keys, get_timeout_); }

void kv_gloo_store::wait(const std::vector<std::string>& keys,
                         const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(generation_key(generation_, k));
  kv_.wait(full, timeout);
}

}  // namespace cohort::comm
