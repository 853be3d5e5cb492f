// The statistics apart takes of repeated measurements: `apart profile` of each task's timed runs, `apart simulate
// --compare` of a run's steps. One home, so a prediction and its measurement are always summarised alike.
#pragma once

#include <algorithm>
#include <vector>

namespace apart {

// The median (the mean of the middle two for an even count; 0 for none): a run the machine slowed (another
// process, a page-fault burst) moves it no more than any other run does.
inline double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

inline double mean(const std::vector<double>& xs) {
  double sum = 0;
  for (double x : xs) sum += x;
  return xs.empty() ? 0 : sum / static_cast<double>(xs.size());
}

}  // namespace apart
