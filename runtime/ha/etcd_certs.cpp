// Certificates through OpenSSL 3's X509 API. Go's TLS stack (etcd) wants the server's
// address in subjectAltName (it ignores the common name) and a CA marked CA:TRUE with
// keyCertSign; the leaf certificates carry both serverAuth and clientAuth, since etcd checks
// the client usage on its peer and client listeners.
#include "runtime/ha/etcd_certs.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "runtime/core/error.hpp"

namespace cohort::ha {

namespace {

struct pkey_free {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct x509_free {
  void operator()(X509* x) const { X509_free(x); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;

[[noreturn]] void fail(const std::string& what) {
  throw io_error("etcd certificates: " + what + " failed (OpenSSL); check libssl3");
}

pkey_ptr new_key() {
  pkey_ptr k(EVP_EC_gen("P-256"));
  if (!k) fail("making an EC P-256 key");
  return k;
}

void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) fail(std::string("extension ") + value);
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) fail(std::string("adding extension ") + value);
}

// A certificate for KEY named CN, signed by ISSUER_KEY (ISSUER null: self-signed).
x509_ptr make_cert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, int days,
                   bool ca, const char* san) {
  x509_ptr x(X509_new());
  if (!x) fail("X509_new");
  X509_set_version(x.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) fail("random serial");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  if (bn == nullptr || BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x.get())) == nullptr)
    fail("serial number");
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -300);  // a clock a little behind
  X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(days) * 24 * 3600);
  X509_set_pubkey(x.get(), key);
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn),
                             -1, -1, 0);
  X509_set_issuer_name(x.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : x.get();
  if (ca) {
    add_ext(x.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(x.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(x.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(x.get(), signer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
    add_ext(x.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  add_ext(x.get(), signer, NID_subject_key_identifier, "hash");
  if (san != nullptr) add_ext(x.get(), signer, NID_subject_alt_name, san);
  if (X509_sign(x.get(), issuer_key, EVP_sha256()) == 0) fail(std::string("signing ") + cn);
  return x;
}

// Writes PEM text made by WRITE to DIR/NAME, 0600, never over an existing file.
template <class Write>
void write_pem(const std::string& dir, const char* name, Write write) {
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw io_error("etcd certificates: cannot create " + path + ": " + std::strerror(errno));
  FILE* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    ::close(fd);
    throw io_error("etcd certificates: cannot write " + path);
  }
  const bool ok = write(f) == 1;
  if (std::fclose(f) != 0 || !ok) throw io_error("etcd certificates: cannot write " + path);
}

}  // namespace

etcd_tls etcd_tls_in(const std::string& dir) {
  etcd_tls t{dir + "/" + etcd_ca_name, dir + "/" + etcd_client_cert_name,
             dir + "/" + etcd_client_key_name};
  for (const std::string* f : {&t.ca_file, &t.cert_file, &t.key_file}) {
    struct stat st {};
    if (::stat(f->c_str(), &st) != 0)
      throw usage_error("etcd over https needs " + *f + " (" + std::strerror(errno) +
                        "): put the etcd cluster's CA certificate and a client certificate and "
                        "key it accepts in the key folder as " +
                        etcd_ca_name + ", " + etcd_client_cert_name + ", " + etcd_client_key_name);
    if (f == &t.key_file && (st.st_mode & 077) != 0)
      throw usage_error(*f + " is readable by group or others: chmod 600 " + *f);
  }
  return t;
}

void make_etcd_certs(const std::string& dir, int days) {
  const pkey_ptr ca_key = new_key();
  const x509_ptr ca =
      make_cert(ca_key.get(), "cohort run etcd CA", nullptr, ca_key.get(), days, true, nullptr);
  const pkey_ptr server_key = new_key();
  const x509_ptr server = make_cert(server_key.get(), "cohort run etcd", ca.get(), ca_key.get(),
                                    days, false, "IP:127.0.0.1,DNS:localhost");
  const pkey_ptr client_key = new_key();
  const x509_ptr client =
      make_cert(client_key.get(), "cohort run", ca.get(), ca_key.get(), days, false, nullptr);
  write_pem(dir, etcd_ca_name, [&](FILE* f) { return PEM_write_X509(f, ca.get()); });
  write_pem(dir, etcd_server_cert_name, [&](FILE* f) { return PEM_write_X509(f, server.get()); });
  write_pem(dir, etcd_server_key_name, [&](FILE* f) {
    return PEM_write_PrivateKey(f, server_key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  write_pem(dir, etcd_client_cert_name, [&](FILE* f) { return PEM_write_X509(f, client.get()); });
  write_pem(dir, etcd_client_key_name, [&](FILE* f) {
    return PEM_write_PrivateKey(f, client_key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
}

}  // namespace cohort::ha
