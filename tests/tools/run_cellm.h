// Runs the real `cellm` executable (CELLM_BINARY, set by tests/tools/CMakeLists.txt)
// as a child process and captures what a user would see: stdout, stderr and how
// it ended (exit code, or the signal that killed it). Plus helpers to build
// model folders in a temporary directory.
//
// Thread-safety: each call spawns and reaps its own child; no shared state.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/temp_dir.h"

extern char** environ;

namespace cellm::testing {

struct CellmRun {
  std::string out;      // stdout
  std::string err;      // stderr
  bool exited = false;  // ended through exit(); false when a signal killed it
  int exit_code = -1;   // valid when exited
  int signal = 0;       // valid when !exited

  // Lines of stderr, without their newlines (a last unterminated line counts).
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  // For assertion messages.
  std::string describe() const {
    std::ostringstream os;
    if (exited) {
      os << "exit code " << exit_code;
    } else {
      os << "killed by signal " << signal;
    }
    os << "\n--- stdout ---\n" << out << "\n--- stderr ---\n" << err;
    return os.str();
  }
};

inline std::string cellm_binary() {
  return CELLM_BINARY;
}
inline std::string source_dir() {
  return CELLM_SOURCE_DIR;
}
inline std::string kjv_dir() {
  return source_dir() + "/models/kjv-small";
}

// Runs `cellm args...` with the source tree as the working directory and
// waits for it. Throws std::runtime_error if the process cannot be started.
inline CellmRun run_cellm(const std::vector<std::string>& args) {
  std::array<int, 2> out_pipe{}, err_pipe{};
  if (pipe(out_pipe.data()) != 0 || pipe(err_pipe.data()) != 0) {
    throw std::runtime_error("pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
    posix_spawn_file_actions_addclose(&actions, fd);
  }
  posix_spawn_file_actions_addchdir_np(&actions, CELLM_SOURCE_DIR);
  const std::string binary = cellm_binary();
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    throw std::runtime_error("posix_spawn " + binary + " failed: " + std::to_string(rc));
  }

  CellmRun run;
  std::array<pollfd, 2> fds = {pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks = {&run.out, &run.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("poll failed");
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  run.exited = WIFEXITED(status);
  if (run.exited) {
    run.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    run.signal = WTERMSIG(status);
  }
  return run;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

// Makes `dst` a model folder whose files are those of every folder in `srcs`
// (later ones win): small files are copied so tests may damage them, files
// over 1 MB are symlinked (replace the link before damaging one).
inline void assemble_model_dir(const std::filesystem::path& dst,
                               std::initializer_list<std::filesystem::path> srcs) {
  namespace fs = std::filesystem;
  fs::create_directories(dst);
  for (const fs::path& src : srcs) {
    for (const fs::directory_entry& e : fs::directory_iterator(src)) {
      if (!e.is_regular_file()) continue;
      const fs::path to = dst / e.path().filename();
      fs::remove(to);
      if (e.file_size() > (1u << 20)) {
        fs::create_symlink(fs::absolute(e.path()), to);
      } else {
        fs::copy_file(e.path(), to);
      }
    }
  }
}

inline nlohmann::json parse_json_file(const std::filesystem::path& p) {
  return nlohmann::json::parse(read_text(p));
}

}  // namespace cellm::testing
