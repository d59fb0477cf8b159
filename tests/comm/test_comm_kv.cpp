// The rendezvous stores: memory_kv and file_kv behave the same (set / blocking get /
// wait / timeouts naming the missing keys), file_kv survives odd keys and leaves no
// temporary files, and kv_gloo_store scopes Gloo's keys to a generation.
#include <dirent.h>
#include <doctest/doctest.h>
#include <gloo/rendezvous/prefix_store.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/kv_client.hpp"
#include "runtime/comm/local_kv.hpp"

using namespace cohort::comm;
using std::chrono::milliseconds;

namespace {

std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/cohort-test-kv-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
          out.push_back(e->d_name);
      closedir(d);
    }
    return out;
  }
  ~temp_dir() {
    for (const auto& e : entries()) unlink((path + "/" + e).c_str());
    rmdir(path.c_str());
  }
};

// Sets KEYS through `a` once `b` is waiting for them: B_BEFORE_WAIT is `b`'s test seam
// (called when a get or wait finds a key missing, before it waits); the setter thread starts
// only after it fired, so the call under test is proven to block and complete later.
class set_while_waiting {
 public:
  set_while_waiting(kv_client& a, std::function<void()>& b_before_wait,
                    std::vector<std::string> keys)
      : hook_(b_before_wait) {
    hook_ = [this] {
      if (waits_++ == 0) waiting_.set_value();
    };
    setter_ = std::thread([this, &a, keys] {
      waiting_.get_future().wait();
      for (const auto& k : keys) a.set(k, bytes(k + "-value"));
    });
  }
  ~set_while_waiting() {
    if (setter_.joinable()) setter_.join();
    hook_ = nullptr;
  }
  /// Joins the setter; how often the seam fired (at least once when the path ran).
  int finish() {
    setter_.join();
    return waits_;
  }

 private:
  std::function<void()>& hook_;
  std::promise<void> waiting_;
  std::thread setter_;
  int waits_ = 0;  // written under b's lock (memory_kv) or by b's calling thread (file_kv)
};

// The contract every kv_client keeps; `a` and `b` are two clients of one store, B_BEFORE_WAIT
// `b`'s test seam.
void check_contract(kv_client& a, kv_client& b, std::function<void()>& b_before_wait) {
  a.set("k1", bytes("one"));
  CHECK(b.get("k1", milliseconds(1000)) == bytes("one"));
  a.set("k1", bytes("uno"));  // overwrite
  CHECK(b.get("k1", milliseconds(1000)) == bytes("uno"));

  // Empty and binary values round-trip.
  std::vector<char> binary = {0, 1, '\n', char(0xff), 0};
  a.set("bin", binary);
  a.set("empty", {});
  CHECK(b.get("bin", milliseconds(1000)) == binary);
  CHECK(b.get("empty", milliseconds(1000)).empty());

  // get blocks until another thread sets the key: set only once get is waiting.
  {
    set_while_waiting later(a, b_before_wait, {"late"});
    CHECK(b.get("late", milliseconds(10000)) == bytes("late-value"));
    CHECK(later.finish() == 1);
  }

  // wait returns once all keys exist (k1 was there before; w1 and w2 come while it waits).
  {
    set_while_waiting setter(a, b_before_wait, {"w1", "w2"});
    CHECK_NOTHROW(b.wait({"w1", "w2", "k1"}, milliseconds(10000)));
    CHECK(setter.finish() == 1);
  }

  // Timeouts throw comm_error(timeout) naming the missing key, and only it.
  try {
    b.get("never", milliseconds(50));
    FAIL("get of a missing key returned");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::timeout);
    CHECK(std::string(e.what()).find("'never'") != std::string::npos);
  }
  try {
    b.wait({"k1", "missing-a", "w2", "missing-b"}, milliseconds(50));
    FAIL("wait for missing keys returned");
  } catch (const comm_error& e) {
    const std::string msg = e.what();
    CHECK(e.kind() == comm_failure::timeout);
    CHECK(msg.find("'missing-a'") != std::string::npos);
    CHECK(msg.find("'missing-b'") != std::string::npos);
    CHECK(msg.find("'k1'") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("memory_kv keeps the kv_client contract") {
  memory_kv kv;
  check_contract(kv, kv, kv.before_wait);
}

TEST_CASE("file_kv keeps the kv_client contract across clients of one directory") {
  temp_dir dir;
  file_kv a(dir.path), b(dir.path);
  check_contract(a, b, b.before_wait);
  for (const auto& e : dir.entries()) CHECK_MESSAGE(e[0] != '~', "temporary file left: " << e);
}

TEST_CASE("file_kv maps any key to one file inside its directory") {
  temp_dir dir;
  file_kv kv(dir.path);
  const std::vector<std::string> keys = {"gen/3/gloo/0", "../escape", "a%2Fb",
                                         "a/b",          "",          ".",
                                         "..",           "~tmp.1.2",  std::string("nul\0byte", 8)};
  for (std::size_t i = 0; i < keys.size(); ++i) kv.set(keys[i], bytes(std::to_string(i)));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    CHECK(kv.get(keys[i], milliseconds(100)) == bytes(std::to_string(i)));
    const std::string p = kv.path_of(keys[i]);
    CHECK(p.rfind(dir.path + "/", 0) == 0);
    CHECK(p.find('/', dir.path.size() + 1) == std::string::npos);
  }
  CHECK(dir.entries().size() == keys.size());  // distinct keys, distinct files
}

TEST_CASE("file_kv refuses a directory it cannot create") {
  CHECK_THROWS_AS(file_kv("/proc/cohort-no-such-dir/x"), comm_error);
}

TEST_CASE("kv_gloo_store scopes Gloo's keys to its generation") {
  memory_kv kv;
  kv_gloo_store g3(kv, 3, milliseconds(100));
  kv_gloo_store g4(kv, 4, milliseconds(100));
  g3.set("0", bytes("addr-of-rank-0"));
  CHECK(kv.get("gen/3/0", milliseconds(10)) == bytes("addr-of-rank-0"));
  CHECK(g3.get("0") == bytes("addr-of-rank-0"));
  // Generation 4 never sees generation 3's value: get waits its timeout, then throws.
  CHECK_THROWS_AS(g4.get("0"), comm_error);
  CHECK_THROWS_AS(g4.wait({"0"}, milliseconds(20)), comm_error);
  CHECK_NOTHROW(g3.wait({"0"}, milliseconds(20)));
  // Gloo's PrefixStore on top (what gloo_comm does with its group prefix).
  gloo::rendezvous::PrefixStore dp(std::string("dp"), g4);
  dp.set("1", bytes("x"));
  CHECK(kv.get("gen/4/dp/1", milliseconds(10)) == bytes("x"));
  CHECK_NOTHROW(dp.wait({"1"}, milliseconds(20)));
  CHECK(generation_key(12, "a/b") == "gen/12/a/b");
}
