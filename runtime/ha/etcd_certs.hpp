// TLS material for etcd: the certificates `cohort launch` makes for the run's own etcd (a
// fresh CA that signs one server and one client certificate, its key then thrown away), and
// the files a client presents, found in a folder. It owns making and finding those files;
// speaking TLS is cpp-httplib's (etcd_client) and etcd's.
#pragma once
#include <string>

namespace cohort::ha {

/// What a TLS client of etcd needs: the CA that signed etcd's certificate, and its own
/// certificate and key (etcd runs with --client-cert-auth: no certificate, no connection).
struct etcd_tls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool empty() const { return ca_file.empty(); }
};

/// File names in a key folder.
inline constexpr const char* etcd_ca_name = "etcd-ca.crt";
inline constexpr const char* etcd_client_cert_name = "etcd-client.crt";
inline constexpr const char* etcd_client_key_name = "etcd-client.key";
inline constexpr const char* etcd_server_cert_name = "etcd-server.crt";
inline constexpr const char* etcd_server_key_name = "etcd-server.key";

/// DIR's etcd-ca.crt, etcd-client.crt and etcd-client.key. usage_error naming the file and
/// the fix when one is missing or the key is readable by group or others.
etcd_tls etcd_tls_in(const std::string& dir);

/// Writes into DIR (which must exist; files 0600, none overwritten) a fresh CA certificate
/// (etcd-ca.crt), a server certificate for 127.0.0.1 with its key (etcd-server.*) and a
/// client certificate with its key (etcd-client.*), EC P-256, valid for DAYS days. The CA's
/// key is never written: nothing else can be signed by it. Throws io_error.
void make_etcd_certs(const std::string& dir, int days = 30);

}  // namespace cohort::ha
