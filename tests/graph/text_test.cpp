// graph/text.h: model-controlled strings printed safely (control characters, bytes that are not UTF-8, DOT).
#include "graph/text.h"

#include <gtest/gtest.h>

namespace apart {
namespace {

TEST(Printable, EscapesControlCharactersSoATerminalCannotActOnThem) {
  EXPECT_EQ(printable("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");  // OSC: would set the window title
  EXPECT_EQ(printable("\x1b[2J"), "\\x1b[2J");                     // CSI: would clear the screen
  EXPECT_EQ(printable("a\nfake line"), "a\\nfake line");
  EXPECT_EQ(printable("tab\there\r"), "tab\\there\\r");
  EXPECT_EQ(printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(printable("del\x7f"), "del\\x7f");
  EXPECT_EQ(printable("c1\xc2\x9b"), "c1\\xc2\\x9b");                // U+009B, the 8-bit CSI
  EXPECT_EQ(printable("rtl\xe2\x80\xae"), "rtl\\u{202e}");          // right-to-left override
}

TEST(Printable, ShowsBytesThatAreNotUtf8AsHex) {
  EXPECT_EQ(printable("bad\xff\xfe"), "bad\\xff\\xfe");
  EXPECT_EQ(printable("cut\xe2\x82"), "cut\\xe2\\x82");  // a truncated three-byte sequence
  EXPECT_EQ(printable("\x9b[2J"), "\\x9b[2J");           // a lone 8-bit CSI byte
}

TEST(Printable, LeavesOrdinaryNamesAndUnicodeTextUnchanged) {
  for (const char* s : {"", "x", "/encoder/layer.0/Add_output_0", "C:\\path", "ünïcødé ×2 → 日本", "emoji 🙂"})
    EXPECT_EQ(printable(s), s);
  EXPECT_EQ(quote("x"), "'x'");
  EXPECT_EQ(quote("a\nb"), "'a\\nb'");
}

TEST(IsUtf8, AcceptsWellFormedTextAndRejectsEveryMalformedForm) {
  EXPECT_TRUE(is_utf8(""));
  EXPECT_TRUE(is_utf8("ascii and ünïcødé and 🙂"));
  EXPECT_TRUE(is_utf8("\x1b[2J"));  // control characters are valid UTF-8: printable() escapes them
  EXPECT_FALSE(is_utf8("\xff"));
  EXPECT_FALSE(is_utf8("\x80"));              // a continuation byte alone
  EXPECT_FALSE(is_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(is_utf8("\xed\xa0\x80"));      // a UTF-16 surrogate
  EXPECT_FALSE(is_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_utf8("\xe2\x82"));          // truncated
}

TEST(DotQuote, EscapesQuotesAndBackslashesAndBreaksLinesAtNewlines) {
  EXPECT_EQ(dot_quote("plain"), "\"plain\"");
  EXPECT_EQ(dot_quote("say \"hi\" \\ bye"), "\"say \\\"hi\\\" \\\\ bye\"");
  EXPECT_EQ(dot_quote("stage 0\n3 tasks"), "\"stage 0\\n3 tasks\"");  // DOT's centred line break
}

TEST(DotQuote, WritesNoControlCharacterRaw) {
  const std::string q = dot_quote("\x1b]0;pwned\x07 a\nfake line");
  EXPECT_EQ(q.find('\x1b'), std::string::npos) << q;
  EXPECT_EQ(q.find('\x07'), std::string::npos) << q;
  EXPECT_EQ(q.find('\n'), std::string::npos) << q;
  EXPECT_EQ(q, "\"\\\\x1b]0;pwned\\\\x07 a\\nfake line\"");  // shown as the text \x1b in the rendered label
}

}  // namespace
}  // namespace apart

namespace apart {
namespace {

TEST(AClosestMatch, SuggestsTheNearestCandidateForATypoAndNothingForAStrangeWord) {
  const std::vector<std::string> commands = {"inspect",  "zoo",    "costs", "partition",
                                             "simulate", "report", "train", "run"};
  EXPECT_EQ(closest_match("partiton", commands), "partition");   // a deletion
  EXPECT_EQ(closest_match("partitoin", commands), "partition");  // a swap of neighbours is one edit
  EXPECT_EQ(closest_match("Simulat", commands), "simulate");     // case is ignored
  EXPECT_EQ(closest_match("rnu", commands), "run");
  EXPECT_EQ(closest_match("trian", commands), "train");
  EXPECT_EQ(closest_match("deploy", commands), std::nullopt);  // nothing near enough
  EXPECT_EQ(closest_match("x", commands), std::nullopt);
  EXPECT_EQ(closest_match("--stepz", {"--steps", "--batch", "--seed"}), "--steps");
  EXPECT_EQ(closest_match("h100", {"h100-80gb", "h200-141gb"}), std::nullopt);  // 5 edits: aliases are another table
  EXPECT_EQ(closest_match("anything", {}), std::nullopt);
}

}  // namespace
}  // namespace apart
