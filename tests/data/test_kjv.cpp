// KJV: the text from `bible`, its cache, the 90/10 split, the vocabulary, a missing program.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "fixtures.hpp"
#include "runtime/core/error.hpp"

using cohort::data_error;
using cohort::kjv;
using cohort::test::kjv_text;
using cohort::test::read_all;
using cohort::test::temp_dir;
using cohort::test::write_all;
namespace fs = std::filesystem;

namespace {

// Sets an environment variable for the scope, restoring the old value after.
class scoped_env {
 public:
  scoped_env(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~scoped_env() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace

TEST_CASE("kjv: bible prints the whole book") {
  const std::string& text = kjv_text();
  CHECK(text.size() > 4000000);
  CHECK(text.rfind("\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n",
                   0) == 0);
  CHECK(text.find("\nRevelation 22\n") != std::string::npos);
  CHECK(kjv::looks_complete(text));
  CHECK_FALSE(kjv::looks_complete(text.substr(0, text.size() / 2)));
}

TEST_CASE("kjv: the text is cached atomically and reused") {
  temp_dir dir;
  const std::string cache_dir = (dir.path() / "nested" / "cache").string();
  const std::string first = kjv::load_text(cache_dir);
  CHECK(first == kjv_text());
  const std::string cache = cache_dir + "/kjv.txt";
  REQUIRE(fs::exists(cache));
  CHECK(read_all(cache) == first);
  int files = 0;
  for (const auto& e : fs::directory_iterator(cache_dir)) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);  // no temporary file left behind

  // A later load reads the cache, not `bible`: mark the cached copy and see the mark.
  std::string marked = first;
  const size_t at = marked.find("void");
  REQUIRE(at != std::string::npos);
  marked.replace(at, 4, "VOID");
  write_all(cache, marked);
  CHECK(kjv::load_text(cache_dir) == marked);

  // A cut-off cache is not trusted: it is regenerated from `bible`.
  write_all(cache, first.substr(0, 1000));
  CHECK(kjv::load_text(cache_dir) == first);
  CHECK(read_all(cache) == first);
}

TEST_CASE("kjv: ~ in cache_dir is $HOME") {
  temp_dir dir;
  scoped_env home("HOME", dir.path().string());
  CHECK(kjv::expand_home("~/.cache/cohort") == dir.path().string() + "/.cache/cohort");
  CHECK(kjv::expand_home("~") == dir.path().string());
  CHECK(kjv::expand_home("/abs/~x") == "/abs/~x");
  CHECK(kjv::load_text("~/.cache/cohort") == kjv_text());
  CHECK(fs::exists(dir.path() / ".cache" / "cohort" / "kjv.txt"));
}

TEST_CASE("kjv: a missing bible program names the package") {
  temp_dir dir;
  scoped_env path("PATH", dir.path().string());
  try {
    kjv::run_bible();
    FAIL("no data_error");
  } catch (const data_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("bible") != std::string::npos);
    CHECK(msg.find("apt-get install bible-kjv") != std::string::npos);
  }
  // Without a cache, load_text needs the program and fails the same way.
  CHECK_THROWS_AS(kjv::load_text(dir.file("cache")), data_error);
}

TEST_CASE("kjv: a failing bible program is reported") {
  temp_dir dir;
  const std::string fake = dir.file("bible");
  write_all(fake, "#!/bin/sh\nexit 3\n");
  fs::permissions(fake, fs::perms::owner_all);
  scoped_env path("PATH", dir.path().string());
  CHECK_THROWS_WITH_AS(kjv::run_bible(), doctest::Contains("exit status 3"), data_error);
}

TEST_CASE("kjv: 90/10 split, sorted byte vocabulary, encode/decode round trip") {
  const kjv ds(kjv_text(), 128);
  const std::string& text = ds.text();
  const int64_t n = static_cast<int64_t>(text.size());
  CHECK(ds.train_size() == n * 9 / 10);
  CHECK(static_cast<int64_t>(ds.train_text().size()) == n * 9 / 10);
  CHECK(static_cast<int64_t>(ds.validation_text().size()) == n - n * 9 / 10);
  CHECK(std::string(ds.train_text()) + std::string(ds.validation_text()) == text);

  std::set<unsigned char> bytes(text.begin(), text.end());
  const std::string expect(bytes.begin(), bytes.end());
  CHECK(ds.vocab() == expect);
  CHECK(ds.num_classes() == static_cast<int>(bytes.size()));
  CHECK(ds.vocab().front() == '\n');
  CHECK(ds.vocab().back() == 'z');

  const auto ids = ds.encode(text);
  REQUIRE(ids.size() == text.size());
  for (size_t i = 0; i < text.size(); i += 4099) CHECK(ds.vocab()[ids[i]] == text[i]);
  CHECK(ds.decode(ids) == text);
  CHECK_THROWS_AS(ds.encode("~"), data_error);  // '~' never occurs in the KJV
  CHECK_THROWS_AS(ds.decode({static_cast<int32_t>(bytes.size())}), data_error);
  CHECK_THROWS_AS(ds.decode({-1}), data_error);

  const auto meta = ds.preprocessing_metadata();
  CHECK(meta.at("data.vocab") == expect);
  CHECK(meta.at("data.vocab_size") == std::to_string(bytes.size()));
  CHECK(meta.at("data.context") == "128");
}

TEST_CASE("kjv: text too short for the context") {
  CHECK_THROWS_AS(kjv(std::string(100, 'a'), 64), data_error);
  CHECK_NOTHROW(kjv(std::string(100, 'a'), 8));
  CHECK_THROWS_AS(kjv(std::string(1000, 'a'), 0), data_error);
}

TEST_CASE("kjv: evaluation windows tile the validation text") {
  const int T = 64;
  const kjv ds(kjv_text(), T);
  const std::string val(ds.validation_text());
  const int64_t windows = (static_cast<int64_t>(val.size()) - 1) / T;
  CHECK(ds.eval_size() == windows);
  CHECK(ds.eval_size(10 * T) == 10);
  CHECK(ds.eval_size(10 * T + T - 1) == 10);
  CHECK(ds.eval_size(1) == 1);
  CHECK(ds.eval_size(int64_t{1} << 40) == windows);

  int64_t k = 0;
  bool ok = true;
  cohort::for_each_eval_batch(ds, 32, 100 * T, [&](const cohort::batch& b) {
    CHECK(b.t == T);
    for (int j = 0; j < b.n; ++j, ++k) {
      const auto want_ids = ds.encode(val.substr(k * T, T));
      const auto want_tg = ds.encode(val.substr(k * T + 1, T));
      ok &= std::equal(want_ids.begin(), want_ids.end(), b.ids.begin() + j * T);
      ok &= std::equal(want_tg.begin(), want_tg.end(), b.targets.begin() + j * T);
    }
  });
  CHECK(ok);
  CHECK(k == 100);
  // The last window ends inside the validation text.
  cohort::batch last;
  ds.eval_batch(windows - 1, 1, last);
  CHECK(ds.decode(last.targets) == val.substr((windows - 1) * T + 1, T));
}
