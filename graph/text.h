// Model-controlled strings made safe to print: control characters escaped, UTF-8 checked, DOT quoting.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace apart {

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_utf8(std::string_view s);

// `s` with everything a terminal would act on made visible: C0 controls and DEL as \n, \t, \r or \xNN,
// C1 controls and bytes that are not UTF-8 as \xNN per byte, and the Unicode line separators and
// bidirectional overrides (U+2028, U+2029, U+202A–U+202E, U+2066–U+2069) as \u{NNNN}. Printable text,
// backslashes included, is left as it is, so ordinary names print unchanged.
std::string printable(std::string_view s);

// printable(s) in single quotes: how messages name a node, value, dim or file.
std::string quote(std::string_view s);

// A DOT double-quoted string: quotes and backslashes escaped, a newline as DOT's centred line break
// (\n), and any other control character shown as visible text (\xNN), never written raw.
std::string dot_quote(std::string_view s);

// The candidate nearest to `word` by edit distance (insertions, deletions, substitutions and swaps of neighbours,
// case ignored) when it is near enough to be what was meant: at most 1 edit for words up to 4 characters, 2 up to 8,
// 3 beyond. Ties go to the earlier candidate. For "did you mean" hints on commands, flags and names.
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace apart
