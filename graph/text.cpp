// Model-controlled strings made safe to print: control characters escaped, UTF-8 checked, DOT quoting.
#include "graph/text.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace apart {

namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] and its code point; 0 when it is not one.
size_t utf8_sequence(std::string_view s, size_t i, uint32_t& cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  size_t n = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) n = 2, cp = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) n = 3, cp = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) n = 4, cp = b0 & 0x07, min = 0x10000;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void append_hex_byte(std::string& out, unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  out += buf;
}

bool is_invisible_format_char(uint32_t cp) {
  return cp == 0x2028 || cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

bool is_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, cp);
    if (n == 0) {
      append_hex_byte(out, static_cast<unsigned char>(s[i]));
      ++i;
      continue;
    }
    if (cp == '\n') out += "\\n";
    else if (cp == '\t') out += "\\t";
    else if (cp == '\r') out += "\\r";
    else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F))
      for (size_t k = 0; k < n; ++k) append_hex_byte(out, static_cast<unsigned char>(s[i + k]));
    else if (is_invisible_format_char(cp)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u{%04x}", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out += s.substr(i, n);
    }
    i += n;
  }
  return out;
}

std::string quote(std::string_view s) { return "'" + printable(s) + "'"; }

std::string dot_quote(std::string_view s) {
  // Split on newlines (DOT line breaks), escape each line's controls as visible text, then DOT-escape.
  std::string out = "\"";
  size_t start = 0;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string line = printable(s.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    for (char c : line) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    if (nl == std::string_view::npos) break;
    out += "\\n";
    start = nl + 1;
  }
  return out + "\"";
}

namespace {

// Optimal string alignment distance (Levenshtein plus the swap of two neighbours), ASCII case folded.
size_t edit_distance(std::string_view a, std::string_view b) {
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  const size_t allowed = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::optional<std::string> best;
  size_t best_distance = allowed + 1;
  for (const std::string& c : candidates) {
    const size_t distance = edit_distance(word, c);
    if (distance < best_distance) best = c, best_distance = distance;
  }
  return best;
}

}  // namespace apart
