#include "runtime/comm/factory.hpp"

#include <cctype>

#include "runtime/comm/gloo_comm.hpp"
#include "runtime/comm/nccl_communicator.hpp"
#include "runtime/comm/shm_comm.hpp"

namespace cohort::comm {

int parse_device(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 8) {
    int index = 0;
    for (std::size_t i = 5; i < device.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(device[i]))) index = -1;
      if (index >= 0) index = index * 10 + (device[i] - '0');
    }
    if (index >= 0) return index;
  }
  throw usage_error("device '" + device + "' is not one of: cpu, cuda, cuda:N");
}

std::string resolve_backend(const std::string& backend, const std::string& device) {
  const bool gpu = parse_device(device) >= 0;
  if (backend == "auto") return gpu ? "nccl" : "gloo";
  if (backend == "gloo") return "gloo";
  if (backend == "nccl") {
    if (!gpu)
      throw usage_error("comm.backend: nccl needs a CUDA device, but the device is '" + device +
                        "'; use comm.backend: gloo or auto");
    return "nccl";
  }
  throw usage_error("comm.backend '" + backend + "' is not one of: auto, gloo, nccl");
}

std::unique_ptr<communicator> make_communicator(const std::string& backend,
                                                const std::string& device, kv_client& kv, int rank,
                                                int size, std::uint64_t generation, int timeout_ms,
                                                const transport_options& transport) {
  if (timeout_ms <= 0) throw usage_error("communicator timeout must be > 0 ms");
  const std::chrono::milliseconds timeout(timeout_ms);
  const std::chrono::milliseconds rendezvous_timeout(
      transport.rendezvous_timeout_ms > 0 ? transport.rendezvous_timeout_ms : timeout_ms);
  if (transport.cancel) transport.cancel->check("build of group '" + transport.group + "'");
  if (resolve_backend(backend, device) == "nccl")
    return std::make_unique<nccl_communicator>(kv, generation, rank, size, parse_device(device),
                                               timeout, rendezvous_timeout,
                                               transport.group + "/nccl");
  std::string transport_kind = transport.transport;
  if (transport_kind == "auto") {
    // Every rank says where it runs; rank 0 decides for the group.
    const auto key = [&](const std::string& k) {
      return generation_key(generation, transport.group + "/transport/" + k);
    };
    const std::string me = host_identity();
    if (rank == 0) {
      bool one_host = true;
      for (int r = 1; r < size && one_host; ++r) {
        const std::vector<char> v = kv.get(key("host/" + std::to_string(r)), rendezvous_timeout);
        one_host = std::string(v.begin(), v.end()) == me;
      }
      transport_kind = one_host && size > 1 ? "shm" : "gloo";
      kv.set(key("kind"), std::vector<char>(transport_kind.begin(), transport_kind.end()));
    } else {
      kv.set(key("host/" + std::to_string(rank)), std::vector<char>(me.begin(), me.end()));
      if (transport.cancel) transport.cancel->check("build of group '" + transport.group + "'");
      const std::vector<char> v = kv.get(key("kind"), rendezvous_timeout);
      transport_kind.assign(v.begin(), v.end());
    }
  }
  if (transport_kind == "shm") {
    shm_options o;
    o.prefix = transport.group + "/shm";
    o.timeout = timeout;
    o.rendezvous_timeout = rendezvous_timeout;
    o.cancel = transport.cancel;
    return std::make_unique<shm_comm>(kv, generation, rank, size, o);
  }
  if (transport_kind != "gloo")
    throw usage_error("comm.transport '" + transport.transport + "' is not one of: auto, gloo, shm");
  // The store adapter is needed only while gloo_comm connects.
  kv_gloo_store store(kv, generation, rendezvous_timeout);
  gloo_options o;
  o.prefix = transport.group + "/gloo";
  o.timeout = timeout;
  o.rendezvous_timeout = rendezvous_timeout;
  o.hostname = transport.hostname;
  o.iface = transport.iface;
  o.cancel = transport.cancel;
  return std::make_unique<gloo_comm>(store, rank, size, o);
}

}  // namespace cohort::comm
