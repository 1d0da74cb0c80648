// Files and folders for checkpoints, through POSIX rather than std::filesystem: libtorch.so (the 2.11 wheel) exports
// its own copies of the std::filesystem functions, a binary linked with it binds to those, and their remove_all
// crashed on a non-empty folder. Every write that must survive a crash goes to a temporary name, is fsynced, and is
// renamed into place (then the folder is fsynced, so the rename itself is durable). No torch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::checkpoint {

enum class PathKind { kMissing, kFile, kDirectory, kOther };
PathKind path_kind(std::string const& path, std::int64_t* size = nullptr);

std::string join(std::string const& dir, std::string const& name);
std::string parent_dir(std::string const& path);
// mkdir -p; throws std::runtime_error naming the component that could not be made.
void make_dirs(std::string const& dir);
// The names in `dir` (without "." and ".."); throws std::runtime_error when it cannot be listed.
std::vector<std::string> list_dir(std::string const& dir);
// rm -r; throws std::runtime_error naming what could not be removed.
void remove_tree(std::string const& path);

// Flushes a file's (or a folder's) contents to the disk; throws std::runtime_error naming it.
void fsync_path(std::string const& path);
// rename(2), then fsync of the destination's folder; throws std::runtime_error naming both paths.
void rename_durably(std::string const& from, std::string const& to);
// `text` into `path` through "<path>.tmp": written, fsynced, renamed. `path` holds the old or the new content, never
// a mix, whatever happens to the process; no .tmp is left behind by a failed write.
void write_file_atomically(std::string const& path, std::string const& text);

// Creates `dir` if needed and proves that a file can be created and removed in it. Throws std::invalid_argument
// "<what> <dir>: cannot ... (<reason>)" otherwise: for checking every output path before a run starts.
void check_writable_dir(std::string const& dir, std::string const& what);

// 64-bit hash of a file's bytes (read in large blocks; ~GB/s): detects a truncated or damaged file.
std::uint64_t file_checksum(std::string const& path);

}  // namespace fusepack::checkpoint
