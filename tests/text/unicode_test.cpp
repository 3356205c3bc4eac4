// NFC and NFD (src/text/unicode.h) on the cases a tokenizer meets: composed and
// decomposed Latin, canonical reordering of marks, composition exclusions,
// singletons, Hangul, and invalid UTF-8, which passes through unchanged and
// blocks reordering and composition across it. Expected strings are Python's
// unicodedata.normalize.
#include "text/unicode.h"

#include <string>

#include <gtest/gtest.h>

namespace cellm::unicode {
namespace {

TEST(UnicodeTest, NfcComposesAndNfdDecomposes) {
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfd("\u00e9"), "e\u0301");
  EXPECT_EQ(nfc("caf\u00e9"), "caf\u00e9");
  EXPECT_EQ(nfd("plain ascii"), "plain ascii");
}

TEST(UnicodeTest, MarksAreReorderedByCombiningClass) {
  // dot above (230) before dot below (220): reordered, then the dot below composes.
  EXPECT_EQ(nfc("q\u0307\u0323"), "q\u0323\u0307");
  EXPECT_EQ(nfc("\u1e0b\u0323"), "\u1e0d\u0307");
  EXPECT_EQ(nfd("\u1e0b\u0323"), "d\u0323\u0307");
  EXPECT_EQ(nfc("a\u0328\u0301\u0308"), "\u0105\u0301\u0308");
}

TEST(UnicodeTest, ExclusionsAndSingletonsStayDecomposed) {
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");  // a composition exclusion
  EXPECT_EQ(nfc("\u212b"), "\u00c5");        // ANGSTROM SIGN, a singleton
  EXPECT_EQ(nfc("\u2126"), "\u03a9");        // OHM SIGN, a singleton
}

TEST(UnicodeTest, HangulComposesAlgorithmically) {
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");
  EXPECT_EQ(nfd("\uac01"), "\u1100\u1161\u11a8");
}

TEST(UnicodeTest, InvalidBytesPassThroughAndBlockComposition) {
  EXPECT_EQ(nfc("e\xff\u0301"), "e\xff\u0301");
  EXPECT_EQ(nfc("\xc3\u0301e\u0301"), "\xc3\u0301\u00e9");
  EXPECT_EQ(nfd("\u00e9\xe0\xa0\u00e9"),
            "e\u0301\xe0\xa0"
            "e\u0301");
  EXPECT_EQ(nfc("q\u0307\x80\u0323"), "q\u0307\x80\u0323");  // no reordering across
  EXPECT_EQ(nfc(std::string("a\0\u0301", 4)), std::string("a\0\u0301", 4));
}

}  // namespace
}  // namespace cellm::unicode
