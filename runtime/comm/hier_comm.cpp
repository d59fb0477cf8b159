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
      leaders_(std::move(leaders)),
      stride_(layout_.max_per_host()) {
  for (int h = 0; h < layout_.hosts(); ++h) members_.push_back(layout_.ranks_of(h));
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

void hier_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  if (bytes == 0) return;  // as alltoall: an empty vector's data() may be null for memcpy
  // Hosts may hold different numbers of ranks: every host's blocks travel in STRIDE slots,
  // so the leaders' allgather has one block size.
  const std::size_t slot = bytes * static_cast<std::size_t>(stride_);
  std::vector<unsigned char> host(slot, 0);
  auto* out = static_cast<unsigned char*>(recv);
  run([&] {
    local_->allgather(send, host.data(), bytes);
    if (leaders_) {
      std::vector<unsigned char> all(slot * members_.size());
      leaders_->allgather(host.data(), all.data(), slot);
      for (std::size_t h = 0; h < members_.size(); ++h)
        for (std::size_t i = 0; i < members_[h].size(); ++i)
          std::memcpy(out + members_[h][i] * bytes, all.data() + h * slot + i * bytes, bytes);
    }
    local_->broadcast(out, bytes * layout_.host_of.size(), 0);
  });
}

void hier_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  if (bytes == 0) return;  // every rank holds the same size: nobody waits for a message
  const std::size_t ranks = layout_.host_of.size(), k = members_[host_].size();
  const std::size_t K = static_cast<std::size_t>(stride_), hosts = members_.size();
  const std::size_t row = bytes * ranks;  // one rank's send (or receive) buffer
  // The host's send buffers, local rank i's at i * row (every local rank gets them: the
  // shared-memory allgather is the gather there is).
  std::vector<unsigned char> mine(row * k), theirs(row * k);
  run([&] {
    local_->allgather(send, mine.data(), row);
    if (leaders_) {
      // To host g: block [i][j] for i a rank of this host, j a rank of g, in K x K slots.
      const std::size_t pair = K * K * bytes;
      std::vector<unsigned char> out(pair * hosts, 0), in(pair * hosts);
      for (std::size_t g = 0; g < hosts; ++g)
        for (std::size_t i = 0; i < k; ++i)
          for (std::size_t j = 0; j < members_[g].size(); ++j)
            std::memcpy(out.data() + g * pair + (i * K + j) * bytes,
                        mine.data() + i * row + members_[g][j] * bytes, bytes);
      leaders_->alltoall(out.data(), in.data(), pair);
      // From host g: block [i][j] is g's rank i's block for this host's rank j, which lands
      // at slot (that rank's number) of local rank j's receive buffer.
      for (std::size_t g = 0; g < hosts; ++g)
        for (std::size_t i = 0; i < members_[g].size(); ++i)
          for (std::size_t j = 0; j < k; ++j)
            std::memcpy(theirs.data() + j * row + members_[g][i] * bytes,
                        in.data() + g * pair + (i * K + j) * bytes, bytes);
    }
    local_->broadcast(theirs.data(), theirs.size(), 0);
  });
  std::memcpy(recv, theirs.data() + layout_.local_rank(rank_) * row, row);
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
