#include "runtime/comm/hier_comm.hpp"

#include <algorithm>
#include <cstring>
#include <map>

namespace cohort::comm {

host_layout host_layout::from_identities(const std::vector<std::string>& identities) {
  host_layout l;
  std::map<std::string, int> seen;
  for (const auto& id : identities) {
    const auto it = seen.emplace(id, static_cast<int>(seen.size())).first;
    l.host_of.push_back(it->second);
  }
  return l;
}

std::string host_layout::to_text() const {
  std::string s;
  for (std::size_t r = 0; r < host_of.size(); ++r) {
    if (r > 0) s += ',';
    s += std::to_string(host_of[r]);
  }
  return s;
}

host_layout host_layout::parse(const std::string& text, int size) {
  const auto bad = [&](const std::string& why) {
    return comm_error(comm_failure::invalid, "host layout '" + text.substr(0, 64) + "'", why);
  };
  host_layout l;
  std::size_t pos = 0;
  while (pos <= text.size() && static_cast<int>(l.host_of.size()) < size) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    if (item.empty() || item.size() > 6 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      throw bad("item " + std::to_string(l.host_of.size()) + " is not a host number");
    l.host_of.push_back(std::stoi(item));
    pos = end + 1;
  }
  if (static_cast<int>(l.host_of.size()) != size || pos <= text.size())
    throw bad("it does not list exactly " + std::to_string(size) + " ranks");
  // Hosts are numbered in order of first appearance: 0, then at most one more than before.
  int next = 0;
  for (int h : l.host_of) {
    if (h > next) throw bad("hosts are not numbered in order of their lowest rank");
    if (h == next) ++next;
  }
  return l;
}

int host_layout::hosts() const {
  return host_of.empty() ? 0 : *std::max_element(host_of.begin(), host_of.end()) + 1;
}

std::vector<int> host_layout::ranks_of(int host) const {
  std::vector<int> out;
  for (std::size_t r = 0; r < host_of.size(); ++r)
    if (host_of[r] == host) out.push_back(static_cast<int>(r));
  return out;
}

int host_layout::local_rank(int rank) const {
  int i = 0;
  for (int r = 0; r < rank; ++r)
    if (host_of[r] == host_of[rank]) ++i;
  return i;
}

int host_layout::leader_of(int host) const { return ranks_of(host).front(); }

int host_layout::max_per_host() const {
  int most = 0;
  for (int h = 0; h < hosts(); ++h) most = std::max(most, static_cast<int>(ranks_of(h).size()));
  return most;
}

hier_comm::hier_comm(int rank, host_layout layout, std::unique_ptr<communicator> local,
                     std::unique_ptr<communicator> leaders)
    : rank_(rank),
      layout_(std::move(layout)),
      host_(layout_.host_of.at(rank)),
      local_(std::move(local)),
      leaders_(std::move(leaders)) {
  const bool leader = layout_.local_rank(rank) == 0;
  if (!local_ || local_->rank() != layout_.local_rank(rank) ||
      local_->size() != static_cast<int>(layout_.ranks_of(host_).size()) ||
      leader != (leaders_ != nullptr) ||
      (leaders_ && (leaders_->rank() != host_ || leaders_->size() != layout_.hosts())))
    throw comm_error(
        comm_failure::invalid, "hierarchical group (rank " + std::to_string(rank) + ")",
        "the local and leader communicators do not match the host layout " + layout_.to_text());
}

template <class F>
void hier_comm::run(F&& f) {
  try {
    f();
  } catch (const comm_error&) {
    // One part failed: the other's peers are (or will be) waiting on this rank; end their
    // calls now rather than at their timeout.
    abort();
    throw;
  }
}

template <class T>
void hier_comm::allreduce(T* data, std::size_t n) {
  run([&] {
    local_->allreduce_sum(data, n);
    if (leaders_) leaders_->allreduce_sum(data, n);
    local_->broadcast(data, n * sizeof(T), 0);
  });
}

void hier_comm::allreduce_sum(float* data, std::size_t n) { allreduce(data, n); }

void hier_comm::allreduce_sum(std::int64_t* data, std::size_t n) { allreduce(data, n); }

void hier_comm::allreduce_sum_compressed(float* data, std::size_t n, wire_format format,
                                         error_memory memory) {
  run([&] {
    local_->allreduce_sum(data, n);
    if (leaders_) compressed_allreduce_sum(*leaders_, data, n, format, memory);
    local_->broadcast(data, n * sizeof(float), 0);
  });
}

void hier_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  if (bytes == 0) return;  // every rank holds the same size: nobody waits for a message
  const std::size_t ranks = layout_.host_of.size();
  std::vector<unsigned char> all(bytes * ranks * ranks);
  allgather(send, all.data(), bytes * ranks);
  auto* out = static_cast<unsigned char*>(recv);
  for (std::size_t r = 0; r < ranks; ++r)
    std::memcpy(out + r * bytes, all.data() + (r * ranks + rank_) * bytes, bytes);
}

void hier_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  if (bytes == 0) return;  // as alltoall: an empty vector's data() may be null for memcpy
  const std::size_t total = bytes * layout_.host_of.size();
  std::vector<std::int64_t> words((total + 7) / 8, 0);
  std::memcpy(reinterpret_cast<unsigned char*>(words.data()) + bytes * rank_, send, bytes);
  allreduce(words.data(), words.size());
  std::memcpy(recv, words.data(), total);
}

void hier_comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size())
    throw comm_error(
        comm_failure::invalid, "hierarchical broadcast",
        "root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size()));
  const int root_host = layout_.host_of[root];
  run([&] {
    if (host_ == root_host) local_->broadcast(data, bytes, layout_.local_rank(root));
    if (leaders_) leaders_->broadcast(data, bytes, root_host);
    if (host_ != root_host) local_->broadcast(data, bytes, 0);
  });
}

void hier_comm::barrier() {
  run([&] {
    local_->barrier();
    if (leaders_) leaders_->barrier();
    local_->barrier();
  });
}

void hier_comm::abort() {
  local_->abort();
  if (leaders_) leaders_->abort();
}

bool hier_comm::dead() const { return local_->dead() || (leaders_ && leaders_->dead()); }

comm_traffic hier_comm::traffic() const {
  comm_traffic t = local_->traffic();
  if (leaders_) {
    const comm_traffic l = leaders_->traffic();
    t.sent += l.sent;
    t.received += l.received;
    t.measured = t.measured && l.measured;
  }
  return t;
}

}  // namespace cohort::comm
