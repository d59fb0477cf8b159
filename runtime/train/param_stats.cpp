#include "runtime/train/param_stats.hpp"

#include <algorithm>
#include <sstream>

#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"
#include "runtime/nn/optim.hpp"

namespace cohort::train {

std::vector<double> grad_sum_squares_by_param(const nn::model& m, bool exact) {
  if (exact) {
    const auto all = grad_square_sums_in(m, {{0, m.num_params()}});
    std::vector<double> out;
    out.reserve(all.size());
    for (const auto& s : all) out.push_back(s.value());
    return out;
  }
  std::vector<std::pair<const float*, int64_t>> spans;
  spans.reserve(m.parameters().size());
  for (const auto& p : m.parameters()) spans.emplace_back(p.grad.data(), p.grad.numel());
  return m.dev().sum_squares_each(spans);
}

std::vector<square_sum> grad_square_sums_in(
    const nn::model& m, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<square_sum> out(m.parameters().size());
  std::vector<float> copy;
  for (std::size_t i = 0; i < m.parameters().size(); ++i) {
    const nn::parameter& p = m.parameters()[i];
    const int64_t pb = p.offset, pe = p.offset + p.grad.numel();
    for (const auto& [b, e] : ranges) {
      const int64_t lo = std::max(b, pb), hi = std::min(e, pe);
      if (lo >= hi) continue;
      const float* g = m.flat_grads().data() + lo;
      if (!m.dev().host_visible()) {
        copy.resize(static_cast<std::size_t>(hi - lo));
        m.dev().to_host(copy.data(), g, copy.size() * sizeof(float));
        g = copy.data();
      }
      out[i].add(g, static_cast<std::size_t>(hi - lo));
    }
  }
  return out;
}

double ordered_sum(const std::vector<double>& parts, double start) {
  double s = start;
  for (double x : parts) s += x;
  return s;
}

void clip_grads(nn::model& m, double norm, float max_norm) {
  const float coef = nn::clip_coefficient(norm, max_norm);
  nn::tensor& g = m.flat_grads();
  if (coef < 1.0f) g.dev().scale(g.data(), coef, g.numel());
}

std::map<std::string, std::string> param_digests(const nn::model& m) {
  std::map<std::string, std::string> out;
  for (const auto& p : m.parameters()) {
    sha256 h;
    std::vector<float> copy;
    h.update(nn::on_host(p.value, p.value.numel(), copy), p.value.bytes());
    out[p.name] = h.hex_digest();
  }
  return out;
}

std::string combine_param_digests(const std::map<std::string, std::string>& digests) {
  sha256 h;
  for (const auto& [name, d] : digests) {
    const std::string line = name + ":" + d + "\n";
    h.update(line.data(), line.size());
  }
  return h.hex_digest();
}

std::string format_param_digests(const std::map<std::string, std::string>& digests) {
  std::string s;
  for (const auto& [name, d] : digests) s += name + ":" + d + "\n";
  return s;
}

std::map<std::string, std::string> parse_param_digests(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.rfind(':');
    if (colon == std::string::npos || colon == 0 || line.size() - colon - 1 != 64)
      throw usage_error("parameter digest line '" + line.substr(0, 80) +
                        "' is not 'name:<64 hex digits>'");
    out[line.substr(0, colon)] = line.substr(colon + 1);
  }
  return out;
}

}  // namespace cohort::train
