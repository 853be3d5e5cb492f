// Numbers read back from what apart printed, and the one tolerance for comparing losses printed by two runs.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace apart::testing {

// The number printed right after the first `key` in `out` ("step=3 loss=" → 6.258438); nullopt when `key` is absent
// or no number follows it.
inline std::optional<double> number_after(const std::string& out, const std::string& key) {
  const size_t at = out.find(key);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = out.c_str() + at + key.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return v;
}

// Two runs of the same model whose arithmetic differs only in the order of its sums (micro-batches against the whole
// batch, MPI's collectives against threads, another OpenBLAS kernel: which one runs depends on the CPU model) give
// losses that agree to a few ulps per operation, not bitwise; printed to 6 decimals they may differ in the last digit
// (6.258438 against 6.258439). The stated tolerance: |a − b| ≤ 2e-6 + 2e-5·|b| (two units of the printed digit, plus
// the relative drift of a few training steps).
constexpr double kPrintedLossAbsolute = 2e-6;
constexpr double kPrintedLossRelative = 2e-5;
inline double printed_loss_tolerance(double reference) {
  return kPrintedLossAbsolute + kPrintedLossRelative * std::fabs(reference);
}

// "" when `out` prints "step=S loss=L" for S = 1..steps, each L within printed_loss_tolerance of what `reference`
// prints for that step (apart run against apart train); else the first step that is missing or differs.
inline std::string printed_losses_differ(const std::string& out, const std::string& reference, int steps) {
  for (int step = 1; step <= steps; ++step) {
    const std::string key = "step=" + std::to_string(step) + " loss=";
    const std::optional<double> want = number_after(reference, key), got = number_after(out, key);
    if (!want || !got) return "no " + key + " printed";
    if (std::fabs(*got - *want) > printed_loss_tolerance(*want))
      return key + std::to_string(*got) + " against " + std::to_string(*want);
  }
  return "";
}

// Texts that are the same but for the last digits of their numbers: `actual` equals `expected` character for character
// outside numbers, and each number (a run strtod reads, starting at a digit, or at a sign or point before one) within
// `relative` of the expected one (|a − e| ≤ relative·max(|e|, 1e-300)). Returns "" when they match, otherwise where
// they first differ. For goldens of computed figures: libm's exp/log/pow take other code paths on CPUs with FMA, so a
// figure's last bit may differ by machine while every decision the text records is the same.
inline std::string first_difference_beyond(const std::string& actual, const std::string& expected, double relative) {
  auto starts_number = [](const std::string& s, size_t i) {
    auto digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
    if (digit(i)) return i == 0 || !(std::isalpha(static_cast<unsigned char>(s[i - 1])) || s[i - 1] == '_');
    if (i < s.size() && (s[i] == '-' || s[i] == '.'))
      return digit(i + 1) || (s[i] == '-' && s[i + 1] == '.' && digit(i + 2));
    return false;
  };
  size_t a = 0, e = 0;
  while (a < actual.size() && e < expected.size()) {
    if (starts_number(actual, a) && starts_number(expected, e)) {
      char* a_end = nullptr;
      char* e_end = nullptr;
      const double av = std::strtod(actual.c_str() + a, &a_end), ev = std::strtod(expected.c_str() + e, &e_end);
      if (a_end != actual.c_str() + a && e_end != expected.c_str() + e) {
        const size_t a_len = static_cast<size_t>(a_end - actual.c_str()) - a;
        const size_t e_len = static_cast<size_t>(e_end - expected.c_str()) - e;
        const bool same_text = actual.compare(a, a_len, expected, e, e_len) == 0;  // "276547e752" of a digest: inf
        if (!same_text && !(std::fabs(av - ev) <= relative * std::fmax(std::fabs(ev), 1e-300)))
          return "number at byte " + std::to_string(e) + ": " + actual.substr(a, a_len) + " against " +
                 expected.substr(e, e_len);
        a = static_cast<size_t>(a_end - actual.c_str());
        e = static_cast<size_t>(e_end - expected.c_str());
        continue;
      }
    }
    if (actual[a] != expected[e])
      return "byte " + std::to_string(e) + ": '" + actual.substr(a, 40) + "' against '" + expected.substr(e, 40) + "'";
    ++a, ++e;
  }
  if (a != actual.size() || e != expected.size())
    return "lengths: " + std::to_string(actual.size()) + " bytes against " + std::to_string(expected.size());
  return "";
}

}  // namespace apart::testing
