// The file-system checks every layer makes before it reads or writes, so that bad input is one
// line naming the option and the cause (exit 2) before any work, instead of a hang on a FIFO, a
// library's "filesystem error: ..." after hours of training, or a write over the user's file.
#pragma once
#include <string>

namespace ab {

// A file that is read must be a regular file (through links): a directory reads as nothing and a
// FIFO blocks forever. Throws InvalidInput naming the path.
void require_regular_file(const std::string& path);

// A directory that is read (a task's --data-dir): InvalidInput naming the option and the cause
// when it is missing, not a directory, or cannot be looked at.
void require_directory(const std::string& option, const std::string& dir);

// Creates DIR and its parents where missing, for the option `option` ("--checkpoint"): an
// existing directory is fine; a file in the way, a read-only file system, a symbolic-link loop or
// a name too long is InvalidInput naming the option, the path and the cause. The directory must
// also be writable.
void make_directory(const std::string& option, const std::string& dir);

// A file the run will append to or replace later (a learning-curve log): absent (its directory
// exists and is writable) or a writable regular file, its name short enough for the temporary an
// atomic write goes through. Checked up front so that a run does not
// train for hours and then fail to write. Throws InvalidInput.
void require_writable_file(const std::string& option, const std::string& path);

// The file a path names: a symbolic link's target (relative to the link's directory) followed to
// the end, so a write replaces the file and keeps the link; any other path as it is.
std::string link_target(const std::string& path);

// Whether two paths name the same file (through links, `.`, `..` and hard links); false when
// either does not exist.
bool same_file(const std::string& a, const std::string& b);

// Removes FILE.tmp.PID files beside FILE whose writing process is gone (an atomic write killed
// between its write and its rename), saying so on stderr. Only names of exactly that pattern are
// touched: the suite made them.
void remove_stale_temporaries(const std::string& file);

// Whether process `pid` no longer exists.
bool process_gone(long pid);

}  // namespace ab
