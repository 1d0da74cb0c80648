#include "trainer/checkpoint/files.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace fusepack::checkpoint {
namespace {

std::string why() { return std::strerror(errno); }

}  // namespace

PathKind path_kind(std::string const& path, std::int64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (size != nullptr) *size = static_cast<std::int64_t>(st.st_size);
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  return PathKind::kOther;
}

std::string join(std::string const& dir, std::string const& name) {
  return dir.empty() ? name : dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string parent_dir(std::string const& path) {
  std::size_t const slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void make_dirs(std::string const& dir) {
  for (std::size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string const prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      throw std::runtime_error("checkpoint " + dir + ": cannot create " + prefix + ": " + why());
    }
  }
  if (path_kind(dir) != PathKind::kDirectory) throw std::runtime_error("checkpoint " + dir + ": not a folder");
}

std::vector<std::string> list_dir(std::string const& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw std::runtime_error("checkpoint " + dir + ": cannot list the folder: " + why());
  while (dirent const* e = ::readdir(d)) {
    std::string const name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

void remove_tree(std::string const& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (std::string const& name : list_dir(path)) remove_tree(join(path, name));
    if (::rmdir(path.c_str()) != 0) throw std::runtime_error("cannot remove the folder " + path + ": " + why());
  } else if (::unlink(path.c_str()) != 0) {
    throw std::runtime_error("cannot remove " + path + ": " + why());
  }
}

void fsync_path(std::string const& path) {
  int const fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " to flush it to disk: " + why());
  int const rc = ::fsync(fd);
  std::string const reason = rc != 0 ? why() : std::string();
  ::close(fd);
  if (rc != 0) throw std::runtime_error("cannot flush " + path + " to disk: " + reason);
}

void rename_durably(std::string const& from, std::string const& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + from + " to " + to + ": " + why());
  }
  fsync_path(parent_dir(to));
}

void write_file_atomically(std::string const& path, std::string const& text) {
  std::string const tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot open " + tmp + " for writing: " + why());
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  std::string const reason = ok ? std::string() : why();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error("writing " + tmp + " failed (disk full?): " + reason);
  }
  try {
    rename_durably(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void check_writable_dir(std::string const& dir, std::string const& what) {
  try {
    make_dirs(dir);
  } catch (std::exception const& e) {
    throw std::invalid_argument(what + " " + dir + ": cannot be created (" + e.what() + ")");
  }
  std::string const probe = join(dir, ".fusepack-write-probe-" + std::to_string(::getpid()));
  int const fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::invalid_argument(what + " " + dir + ": cannot write a file there (" + why() + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

std::uint64_t file_checksum(std::string const& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path + " to check it: " + why());
  // FNV-1a over 8-byte words (the tail byte by byte), then a final mix: fast, and any changed, lost or added byte
  // changes it (not a cryptographic hash: it guards against damage, not against an adversary).
  std::uint64_t h = 14695981039346656037ull;
  std::vector<unsigned char> buf(std::size_t{1} << 22);
  std::size_t n;
  std::uint64_t total = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, buf.data() + i, 8);
      h = (h ^ w) * 1099511628211ull;
      h ^= h >> 29;
    }
    for (; i < n; ++i) h = (h ^ buf[i]) * 1099511628211ull;
    total += n;
  }
  bool const failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw std::runtime_error("reading " + path + " failed");
  h ^= total;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

}  // namespace fusepack::checkpoint
