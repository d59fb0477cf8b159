// The rule is OpenSSH's for ~/.ssh and its keys (StrictModes), applied to whole folders: what
// another user can write, they can replace, so its content says nothing about who wrote it.
#include "runtime/core/folder_trust.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

namespace cohort {
namespace {

namespace fs = std::filesystem;

std::string user_name(uid_t uid) {
  std::vector<char> buf(16384);
  passwd entry{};
  passwd* found = nullptr;
  std::string out = "uid " + std::to_string(uid);
  if (getpwuid_r(uid, &entry, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
      found->pw_name != nullptr)
    out += " (" + std::string(found->pw_name) + ")";
  return out;
}

std::string mode_text(mode_t m) {
  char s[8];
  std::snprintf(s, sizeof s, "%04o", static_cast<unsigned>(m & 07777));
  return s;
}

// "PATH: owned by uid N (name), mode 0777": the facts every refusal states.
std::string facts(const std::string& path, const struct stat& st) {
  return path + " is owned by " + user_name(st.st_uid) + " with mode " + mode_text(st.st_mode);
}

// `chown UID PATH`, and `chmod go-w PATH` too when others can also write it.
std::string ownership_fix(const std::string& path, const struct stat& st) {
  std::string fix = "`chown " + std::to_string(::geteuid()) + " " + path + "`";
  if ((st.st_mode & 022) != 0 && !S_ISLNK(st.st_mode)) fix += " and `chmod go-w " + path + "`";
  return fix;
}

[[noreturn]] void refuse(const std::string& what, const std::string& dir, const std::string& why,
                         const std::string& fix) {
  throw untrusted_folder_error(
      what + " " + dir + ": " + why + "; another user could plant or replace what a run loads " +
      "from it, so it is refused (" + fix + ", or use a folder of your own; docs/security.md)");
}

struct stat lstat_or_refuse(const std::string& what, const std::string& dir,
                            const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    throw untrusted_folder_error(what + " " + dir + ": cannot inspect " + path + ": " +
                                 std::strerror(errno));
  return st;
}

// A folder above DIR: anyone who can write it can rename DIR away and put their own in its
// place, unless it is sticky (then only DIR's owner can).
void check_above(const std::string& what, const std::string& dir, const fs::path& folder) {
  const std::string p = folder.string();
  const struct stat st = lstat_or_refuse(what, dir, p);
  const uid_t me = ::geteuid();
  if (S_ISLNK(st.st_mode)) {
    if (st.st_uid != me && st.st_uid != 0)
      refuse(what, dir, "the symbolic link " + facts(p, st) + ", not by you or root",
             "replace the link with one of your own");
    return;  // its target's chain is checked from the resolved path
  }
  if (st.st_uid != me && st.st_uid != 0)
    refuse(what, dir,
           "the folder above it " + facts(p, st) + ", not by you (" + user_name(me) +
               ") or root, so its owner can swap it",
           "move it under a folder you own");
  if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0)
    refuse(what, dir,
           "the folder above it " + facts(p, st) + ": others can rename it and put theirs there",
           "`chmod go-w " + p + "` (or `chmod +t " + p + "`)");
}

void check_chain(const std::string& what, const std::string& dir, const fs::path& path) {
  std::vector<fs::path> above;
  for (fs::path p = path.parent_path(); !p.empty(); p = p.parent_path()) {
    above.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = above.rbegin(); it != above.rend(); ++it) check_above(what, dir, *it);
}

// An entry inside DIR (not followed): the user's, and not writable by others.
void check_entry(const std::string& what, const std::string& dir, const fs::path& path, int depth) {
  const std::string p = path.string();
  const struct stat st = lstat_or_refuse(what, dir, p);
  const uid_t me = ::geteuid();
  if (st.st_uid != me)
    refuse(what, dir, facts(p, st) + ", not by you (" + user_name(me) + ")",
           ownership_fix(p, st) + " if it is yours, else remove it");
  if (S_ISLNK(st.st_mode)) return;  // a link's own mode means nothing
  if ((st.st_mode & 022) != 0)
    refuse(what, dir, facts(p, st) + ": group or others can write it", "`chmod go-w " + p + "`");
  if (!S_ISDIR(st.st_mode) || depth <= 0) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec))
    check_entry(what, dir, e.path(), depth - 1);
  if (ec)
    throw untrusted_folder_error(what + " " + dir + ": cannot list " + p + ": " + ec.message());
}

}  // namespace

void require_private_folder(const std::string& dir, const std::string& what, int depth) {
  std::error_code ec;
  fs::path written = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) throw untrusted_folder_error(what + " " + dir + ": " + ec.message());
  if (!written.has_filename() && written.has_parent_path()) written = written.parent_path();
  fs::path path = written;
  // A folder still to be made: the nearest one above that exists must be safe to make it in.
  while (fs::symlink_status(path, ec).type() == fs::file_type::not_found &&
         path != path.parent_path())
    path = path.parent_path();
  if (path != written) {
    check_chain(what, dir, path / "x");
    const fs::path real = fs::canonical(path, ec);
    if (!ec) check_chain(what, dir, real / "x");
    return;
  }
  check_chain(what, dir, path);
  const struct stat link = lstat_or_refuse(what, dir, path.string());
  const uid_t me = ::geteuid();
  if (S_ISLNK(link.st_mode) && link.st_uid != me && link.st_uid != 0)
    refuse(what, dir, "the symbolic link " + facts(path.string(), link) + ", not by you or root",
           "replace the link with one of your own");
  const fs::path real = fs::canonical(path, ec);
  if (ec) throw untrusted_folder_error(what + " " + dir + ": " + ec.message());
  if (real != path) check_chain(what, dir, real);
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0)
    throw untrusted_folder_error(what + " " + dir + ": cannot inspect " + real.string() + ": " +
                                 std::strerror(errno));
  const std::string shown =
      real == path ? real.string() : real.string() + " (where " + dir + " leads)";
  if (!S_ISDIR(st.st_mode)) throw untrusted_folder_error(what + " " + dir + " is not a folder");
  if (st.st_uid != me)
    refuse(what, dir, facts(shown, st) + ", not by you (" + user_name(me) + ")",
           ownership_fix(real.string(), st) + " if it is yours");
  if ((st.st_mode & 022) != 0)
    refuse(what, dir, facts(shown, st) + ": group or others can write it",
           "`chmod go-w " + real.string() + "`");
  if (depth <= 0) return;
  for (const auto& e : fs::directory_iterator(real, ec))
    check_entry(what, dir, e.path(), depth - 1);
  if (ec)
    throw untrusted_folder_error(what + " " + dir + ": cannot list " + real.string() + ": " +
                                 ec.message());
}

}  // namespace cohort
