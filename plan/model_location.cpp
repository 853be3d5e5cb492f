// locate_plan_model: a plan folder that travels with its model runs from any working directory.
#include "plan/model_location.h"

#include <vector>

#include "graph/error.h"
#include "graph/sha256.h"
#include "graph/text.h"

namespace fs = std::filesystem;

namespace apart {
namespace {

std::string short_hash(const std::string& sha) { return sha.substr(0, 12) + "…"; }

std::string joined(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

fs::path normal_absolute(const fs::path& p) {
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : resolved;
}

}  // namespace

void record_model_location(PlanModel& model, const fs::path& model_path, const fs::path& plan_dir) {
  const fs::path model_abs = normal_absolute(model_path);
  const fs::path dir_abs = normal_absolute(plan_dir);
  model.absolute_path = model_abs.string();
  const fs::path relative = model_abs.lexically_relative(dir_abs);
  model.relative_path = relative.empty() ? model_abs.string() : relative.generic_string();
}

PlanModelLocation locate_plan_model(const PlanDocument& plan, const fs::path& plan_dir, const fs::path& model_arg) {
  const std::string want = plan.model ? plan.model->sha256 : "";
  struct Place {
    fs::path path;
    std::string found_by;
  };
  std::vector<Place> places;
  if (!model_arg.empty()) {
    places.push_back({model_arg, "--model"});
  } else if (plan.model) {
    if (plan.model->relative_path)
      places.push_back({(plan_dir / *plan.model->relative_path).lexically_normal(), "the plan folder"});
    if (plan.model->absolute_path) places.push_back({*plan.model->absolute_path, "the absolute path"});
    if (!plan.model->path.empty()) places.push_back({plan.model->path, "the path given to apart partition"});
  }
  std::vector<std::string> tried, mismatched;
  std::vector<fs::path> hashed;
  for (const Place& place : places) {
    std::error_code ec;
    if (!fs::is_regular_file(place.path, ec)) {
      tried.push_back(quote(place.path.string()) + " (" + place.found_by + ")");
      continue;
    }
    bool seen = false;  // the same file by two names is hashed once
    for (const fs::path& h : hashed) seen = seen || fs::equivalent(h, place.path, ec);
    if (seen) continue;
    hashed.push_back(place.path);
    const std::string sha = sha256_file_hex(place.path);
    if (want.empty() || sha == want) return {place.path, sha, place.found_by};
    mismatched.push_back(quote(place.path.string()) + " (" + place.found_by + ", sha256 " + short_hash(sha) + ")");
  }
  if (!mismatched.empty())
    throw InvalidArgument("the model at " + joined(mismatched, " and at ") +
                          (mismatched.size() == 1 ? " is" : " are other bytes:") +
                          " not the one the plan was made for (sha256 " + short_hash(want) +
                          "): re-run apart partition on it, or pass the plan's model with --model FILE");
  if (places.empty())
    throw InvalidArgument("plan.json names no model: pass the model the plan was made for with --model FILE");
  throw InvalidArgument("the model the plan was made for is not at " + joined(tried, " nor at ") +
                        ": copy it beside the plan folder as it was, or pass it with --model FILE");
}

}  // namespace apart
