// The one helper the folder-trust tests share: what a call refuses as an untrusted folder.
#pragma once
#include <string>

#include "runtime/core/folder_trust.hpp"

namespace cohort::test {

/// The message of what F throws as untrusted_folder_error, or "" when it throws nothing.
template <class F>
std::string untrusted(F f) {
  try {
    f();
  } catch (const untrusted_folder_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace cohort::test
