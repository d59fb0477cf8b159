// The hierarchical backend of communicator (comm.hierarchy): a group spread over several
// hosts, with a fast communicator among the ranks of each host (shared memory) and one
// among the first rank of each host, its leader (Gloo over TCP). An allreduce sums inside
// each host, then among the leaders, then hands the result back inside each host, so the
// slow links carry one leaders' ring instead of every rank's; allgather and alltoall move
// the ranks' blocks through the leaders the same way. Owns the composition only: the two
// communicators are built (and chosen) by the factory, runtime/comm/factory.hpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"

namespace cohort::comm {

/// How the ranks of a group sit on hosts: host_of[r] is rank r's host, numbered 0, 1, ...
/// in the order of each host's lowest rank. Computed once by rank 0 from every rank's host
/// identity (factory) and shared as text, so every rank builds the same shape.
struct host_layout {
  std::vector<int> host_of;

  /// Groups `identities` (one per rank) into hosts in first-appearance order.
  static host_layout from_identities(const std::vector<std::string>& identities);
  /// "0,0,1,1" and back; parse throws comm_error(invalid) on anything malformed.
  std::string to_text() const;
  static host_layout parse(const std::string& text, int size);

  int hosts() const;
  /// The ranks of host h, ascending (the local ranks 0, 1, ... of that host).
  std::vector<int> ranks_of(int host) const;
  /// Rank r's index among the ranks of its host.
  int local_rank(int rank) const;
  /// The leader (lowest rank) of host h; leaders are ranked by host number.
  int leader_of(int host) const;
  /// Most ranks on any one host.
  int max_per_host() const;
};

class hier_comm final : public communicator {
 public:
  /// `local`: this host's ranks (local rank 0 is the host's leader). `leaders`: the host
  /// leaders, ranked by host number; non-null exactly on a leader. Both must be built for
  /// the same generation; `layout` gives this rank's place.
  hier_comm(int rank, host_layout layout, std::unique_ptr<communicator> local,
            std::unique_ptr<communicator> leaders);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(layout_.host_of.size()); }
  const char* backend() const override { return "hierarchical"; }

  /// Sum inside the host, sum among leaders, broadcast inside the host: every rank gets
  /// the leader's bits. Float sums are in another order than a flat ring's (fast mode);
  /// int64 sums are exact and equal any other backend's.
  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(std::int64_t* data, std::size_t n) override;
  /// Block r lands at r * bytes on every rank: the host's blocks gathered inside it, the
  /// leaders' allgather of them (each link carries the other hosts' blocks once), the
  /// whole handed back inside the host. Bytes are moved, never added: exact.
  void allgather(const void* send, void* recv, std::size_t bytes) override;
  /// Rank r's block j lands at rank j's block r: the host's send buffers gathered at its
  /// leader, one leaders' alltoall carrying host g's blocks for host h's ranks from g to
  /// h, each host's received blocks handed out inside it. What a flat alltoall delivers,
  /// so the compressed sum over this group is the flat one's, bit for bit, whichever
  /// ranks share a host (docs/compression.md).
  void alltoall(const void* send, void* recv, std::size_t bytes) override;
  /// Inside the root's host, then among leaders, then inside the other hosts.
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  /// Aborts both communicators (the peers of either fail promptly).
  void abort() override;
  bool dead() const override;
  /// The sum of both communicators' traffic (measured only if both measure).
  comm_traffic traffic() const override;

  const host_layout& layout() const { return layout_; }

 private:
  template <class T>
  void allreduce(T* data, std::size_t n);
  // Runs F, turning a failure of either part into this communicator's death.
  template <class F>
  void run(F&& f);

  int rank_;
  host_layout layout_;
  int host_;
  std::vector<std::vector<int>> members_;  // members_[h]: layout_.ranks_of(h)
  int stride_;                             // layout_.max_per_host(): a host's padded slots
  std::unique_ptr<communicator> local_;
  std::unique_ptr<communicator> leaders_;
};

}  // namespace cohort::comm
