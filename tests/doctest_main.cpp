// The one doctest main shared by every unit and multi-process test binary. Besides running
// doctest, it refuses a run that matched no test case: CTest runs each case as its own entry
// with --test-case=NAME, and a name CTest mangles (a ';' splits it) or a filter that matches
// nothing would otherwise exit 0 and count as a pass. COHORT_EXPECT_CASES=N (set on every
// entry by cohort_test in tests/CMakeLists.txt) demands exactly N cases ran.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// Test cases that passed the filters in the last run (-1: no run, e.g. --list-test-cases).
int g_cases_matched = -1;

// A listener that only reads the run's totals.
struct case_counter : doctest::IReporter {
  explicit case_counter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    g_cases_matched = static_cast<int>(s.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("cohort_case_counter", 1, case_counter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || g_cases_matched < 0) return rc;
  const char* expect = std::getenv("COHORT_EXPECT_CASES");
  const int want = expect != nullptr ? std::atoi(expect) : -1;
  if (g_cases_matched == 0 || (want >= 0 && g_cases_matched != want)) {
    std::fprintf(stderr,
                 "[cohort] this run matched %d test case(s)%s: the --test-case filter does not "
                 "name exactly one case. A test-case name must not contain ';' (CTest splits "
                 "it), '*' or '?' (doctest wildcards); rename the case.\n",
                 g_cases_matched, want >= 0 ? (", expected " + std::to_string(want)).c_str() : "");
    return rc != 0 ? rc : 1;
  }
  return rc;
}
