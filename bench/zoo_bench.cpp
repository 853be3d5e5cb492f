// Generates the big zoo presets (shapes only, as planning uses them) and prints wall time and peak RSS of each.
// Usage: bench_zoo [preset[:none|:random]...]   (default: the presets over 1B params, shapes only, plus gpt2-small
// with random weights inline)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "models/zoo.h"

namespace {

using apart::models::WeightsMode;

struct Job {
  std::string preset;
  WeightsMode weights;
};

// Runs one generation in a child so each row's peak RSS is its own (ru_maxrss only ever grows).
bool run(const Job& job, const std::filesystem::path& dir) {
  const std::string out = (dir / (job.preset + ".onnx")).string();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    try {
      apart::models::ZooOptions o = apart::models::options_for(job.preset);
      o.weights = job.weights;
      apart::models::write_zoo_model(o, out);
      _exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", job.preset.c_str(), e.what());
      _exit(1);
    }
  }
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  std::error_code ec;
  const double mb = static_cast<double>(std::filesystem::file_size(out, ec)) / 1e6;
  const double weights_mb =
      static_cast<double>(std::filesystem::file_size(dir / (job.preset + ".weights"), ec)) / 1e6;
  const auto o = apart::models::options_for(job.preset);
  std::printf("%-12s %-7s %9s %9.3f %10.1f %10.2f %10.1f\n", job.preset.c_str(),
              std::string(apart::models::weights_name(job.weights)).c_str(),
              apart::models::format_count(apart::models::closed_form_params(o)).c_str(), seconds,
              static_cast<double>(usage.ru_maxrss) / 1024.0, mb, ec ? 0.0 : weights_mb);
  std::filesystem::remove(out, ec);
  std::filesystem::remove(dir / (job.preset + ".weights"), ec);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Job> jobs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    WeightsMode weights = WeightsMode::kNone;
    if (const auto colon = arg.find(':'); colon != std::string::npos) {
      weights = arg.substr(colon + 1) == "random" ? WeightsMode::kRandom : WeightsMode::kNone;
      arg.resize(colon);
    } else {
      weights = apart::models::options_for(arg).weights;
    }
    jobs.push_back({arg, weights});
  }
  if (jobs.empty()) {
    jobs.push_back({"gpt2-small", WeightsMode::kRandom});
    for (const auto& p : apart::models::zoo_presets())
      if (apart::models::closed_form_params(p.options) > 1'000'000'000) jobs.push_back({p.name, WeightsMode::kNone});
  }
  const auto dir = std::filesystem::temp_directory_path() / ("apart_bench_zoo_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::printf("%-12s %-7s %9s %9s %10s %10s %10s\n", "preset", "weights", "params", "wall_s", "peak_rss_MB",
              "onnx_MB", "weights_MB");
  bool ok = true;
  for (const auto& job : jobs) ok = run(job, dir) && ok;
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
